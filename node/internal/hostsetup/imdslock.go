package hostsetup

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/dynk8s/dynk8s/node/internal/system"
	"github.com/dynk8s/dynk8s/node/nodeconfig"
)

// The lockdown of the instance metadata service, and with it of the node role's credentials (hence the join token):
// run by dynk8s-imds-lock.service, which the kubelet's drop-in requires, so it fails closed: no kubelet without it.
// The agent's join starts it before kubeadm join, so that a failure stops the join with its reason.

// instanceConnectUser is EC2 Instance Connect's: sshd looks an operator's pushed key up in the metadata as that user
// (aws/aws-ec2-instance-connect-config, eic_run_authorized_keys), so the lockdown lets it through when the image
// has it.
const instanceConnectUser = "ec2-instance-connect"

// imdsRuleset keeps the metadata service from everything but root and the listed users on the host, and from every
// pod in a network namespace of its own (their packets are forwarded; a node never forwards anything to the metadata
// service legitimately). A pod on the host network running as root, or as a listed user, still reaches it: only Pod
// Security keeps such pods off the nodes. fd00:ec2::254 is the service's IPv6 address, answered only where the
// instance enables it. The leading "table"/"delete table" pair makes a reload replace the rules instead of adding
// copies.
const imdsRuleset = `table inet dynk8s_imds_lock
delete table inet dynk8s_imds_lock
table inet dynk8s_imds_lock {
  set imds_users {
    type uid
    elements = { %s }
  }
  chain output {
    type filter hook output priority filter; policy accept;
    ip daddr 169.254.169.254 meta skuid != @imds_users drop
    ip6 daddr fd00:ec2::254 meta skuid != @imds_users drop
  }
  chain forward {
    type filter hook forward priority filter; policy accept;
    ip daddr 169.254.169.254 drop
    ip6 daddr fd00:ec2::254 drop
  }
}
`

// lookupUID is a local user's uid; ok false when there is no such user.
type lookupUID func(name string) (uid int, ok bool, err error)

// localUser looks a user up in passwd(5) at path (/etc/passwd; DYNK8S_ROOT's in tests), as os/user does without cgo
// but under the agent's root: the system users an image's packages create (sysusers.d) are local.
func localUser(path string) lookupUID {
	return func(name string) (int, bool, error) {
		b, err := os.ReadFile(path)
		if errors.Is(err, fs.ErrNotExist) {
			return 0, false, nil
		}
		if err != nil {
			return 0, false, err
		}
		for line := range strings.Lines(string(b)) {
			f := strings.Split(strings.TrimSpace(line), ":")
			if len(f) < 3 || f[0] != name {
				continue
			}
			uid, err := strconv.Atoi(f[2])
			if err != nil {
				return 0, false, fmt.Errorf("%s: user %s has uid %q", path, name, f[2])
			}
			return uid, true, nil
		}
		return 0, false, nil
	}
}

// lockUIDs are root, cfg's users and, if the image has it, EC2 Instance Connect's: the users that reach the service.
func lockUIDs(cfg nodeconfig.Node, lookup lookupUID) (string, error) {
	uids := append([]int{0}, cfg.Host.MetadataUIDs...)
	eic, ok, err := lookup(instanceConnectUser)
	if err != nil {
		return "", fmt.Errorf("look up %s: %w", instanceConnectUser, err)
	}
	if ok {
		if eic < 1 {
			return "", fmt.Errorf("%s has uid %d: not a user the lockdown can tell from root", instanceConnectUser, eic)
		}
		uids = append(uids, eic)
	}
	slices.Sort(uids)
	names := make([]string, 0, len(uids))
	for _, u := range slices.Compact(uids) {
		names = append(names, strconv.Itoa(u))
	}
	return strings.Join(names, ", "), nil
}

// lockMetadata writes the ruleset under /run/dynk8s (for an operator to read) and loads it with nft.
func lockMetadata(ctx context.Context, cfg nodeconfig.Node, lookup lookupUID, h system.Host, f system.Files, log *system.Logger) error {
	uids, err := lockUIDs(cfg, lookup)
	if err != nil {
		return err
	}
	ruleset := fmt.Sprintf(imdsRuleset, uids)
	path := f.Run("imds-lock.nft")
	if err := os.MkdirAll(f.Run(""), 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(path, []byte(ruleset), 0o644); err != nil {
		return err
	}
	if err := h.Run(ctx, time.Minute, false, "nft", "-f", path); err != nil {
		return fmt.Errorf("nft could not load %s: %w", path, err)
	}
	log.Printf("instance metadata locked: only uids %s reach it on the host; no pod network at all", uids)
	return nil
}
