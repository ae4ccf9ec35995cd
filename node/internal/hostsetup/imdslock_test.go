package hostsetup

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/dynk8s/dynk8s/internal/testkit/realtools"
	"github.com/dynk8s/dynk8s/node/internal/system"
)

// The lockdown lets root, the pool's users and EC2 Instance Connect's (when the image has it) reach the metadata
// service on the host, and no pod in a network namespace of its own; a ruleset nft refuses fails the unit with one
// reason.
func TestLockMetadata(t *testing.T) {
	for name, c := range map[string]struct {
		passwd  string
		nftFail bool
		uids    string
		failure string
	}{
		"with EC2 Instance Connect": {passwd: "root:x:0:0::/root:/bin/bash\nec2-instance-connect:x:977:977::/:/sbin/nologin\n",
			uids: "0, 977, 1000"},
		"without":              {passwd: "root:x:0:0::/root:/bin/bash\n", uids: "0, 1000"},
		"no passwd":            {uids: "0, 1000"},
		"a root alias":         {passwd: "ec2-instance-connect:x:0:0::/:/sbin/nologin\n", failure: "ec2-instance-connect has uid 0"},
		"a uid that is no uid": {passwd: "ec2-instance-connect:x:nine:977::/:/sbin/nologin\n", failure: `has uid "nine"`},
		"nft refuses":          {nftFail: true, failure: "nft could not load"},
	} {
		t.Run(name, func(t *testing.T) {
			r := newHostRig(t)
			if c.passwd != "" {
				assert.NilError(t, os.MkdirAll(filepath.Join(r.root, "etc"), 0o755))
				assert.NilError(t, os.WriteFile(filepath.Join(r.root, "etc/passwd"), []byte(c.passwd), 0o644))
			}
			f := system.Files{Root: r.root}
			ruleset := f.Run("imds-lock.nft")
			if c.nftFail {
				r.host.fail["nft -f "+ruleset] = true
			}
			err := lockMetadata(context.Background(), r.cfg, localUser(f.Etc("passwd")), r.host, f,
				system.NewLogger("dynk8s-imds-lock", r.log, r.root))
			if c.failure != "" {
				assert.ErrorContains(t, err, c.failure)
				return
			}
			assert.NilError(t, err)
			assert.Check(t, is.DeepEqual(r.host.Recorded(), []string{"nft -f " + ruleset}))
			b, err := os.ReadFile(ruleset)
			assert.NilError(t, err)
			assert.Check(t, is.Contains(string(b), "elements = { "+c.uids+" }"))
			assert.Check(t, is.Contains(r.log.String(), "instance metadata locked: only uids "+c.uids+" reach it"))
		})
	}
}

// The real nft(8) checks the ruleset, loaded twice over itself (a restart of the unit), and refuses a rule that
// names a set the ruleset does not declare, so the check can fail.
func TestIMDSRulesetLoads(t *testing.T) {
	nft := realtools.Require(t, "nft")
	ruleset := func(uids string) string { return strings.Replace(imdsRuleset, "%s", uids, 1) }
	// Both of the service's addresses, on the host and forwarded: IMDS answers on fd00:ec2::254 where the instance
	// enables its IPv6 endpoint (EC2 User Guide, "Instance metadata service endpoints").
	for _, want := range []string{"ip daddr 169.254.169.254 meta skuid != @imds_users drop",
		"ip6 daddr fd00:ec2::254 meta skuid != @imds_users drop",
		"type filter hook forward priority filter; policy accept;\n    ip daddr 169.254.169.254 drop\n    ip6 daddr fd00:ec2::254 drop"} {
		assert.Check(t, is.Contains(imdsRuleset, want))
	}
	check := func(doc string) (string, error) {
		f := filepath.Join(t.TempDir(), "imds.nft")
		assert.NilError(t, os.WriteFile(f, []byte(doc), 0o600))
		out, err := exec.Command(nft, "-c", "-f", f).CombinedOutput()
		return string(out), err
	}
	out, err := check(ruleset("0, 977, 1000") + ruleset("0, 1000"))
	assert.NilError(t, err, "nft -c: %s", out)
	_, err = check(strings.Replace(ruleset("0"), "meta skuid != @imds_users", "meta skuid != @imds_userz", 1))
	assert.Assert(t, err != nil, "nft -c accepted a rule naming a set that does not exist")
}
