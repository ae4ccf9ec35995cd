package cloudinit

import (
	"fmt"
	"regexp"
	"strconv"
	"time"

	"github.com/dynk8s/dynk8s/node/nodeconfig"
)

// Agent is where an instance downloads the node agent from: one object of the stack's agent bucket, pinned by its
// S3 version and its sha256 (infra.AgentBucket picks the object of the instance's architecture). The region is the
// instance's own, from IMDS. All of it is public: the instance role's credentials are read at boot.
type Agent struct {
	Bucket    string // the bucket's name
	Key       string // e.g. "dynk8s-node/linux-arm64"
	VersionID string // the S3 version holding exactly these bytes
	SHA256    string // lowercase hex
}

// Where the bootstrap's files go.
const (
	agentUnitName = "dynk8s-agent.service"
	agentEnvPath  = "/etc/dynk8s/agent.env"
	agentScript   = libexecDir + "/fetch-agent.sh"
)

var (
	// s3BucketRE is S3's rule for a bucket name (General purpose bucket naming rules, S3 User Guide), without dots:
	// a path-style URL needs none, and the stack's names have none.
	s3BucketRE = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{1,61}[a-z0-9]$`)
	// s3KeyRE is the keys the stack writes: path segments of URL-safe characters, so the URL needs no escaping.
	s3KeyRE = regexp.MustCompile(`^[A-Za-z0-9._-]+(/[A-Za-z0-9._-]+)*$`)
	// versionIDRE is what S3 version ids are made of (URL-safe as they stand), or S3's "null" of an unversioned
	// object.
	versionIDRE = regexp.MustCompile(`^[A-Za-z0-9._-]{1,1000}$`)
	sha256RE    = regexp.MustCompile(`^[0-9a-f]{64}$`)
)

func (a Agent) validate(e *errs) {
	check := func(field, value string, re *regexp.Regexp, what string) {
		if !re.MatchString(value) {
			e.add("Agent."+field, fmt.Errorf("%q is not %s", value, what))
		}
	}
	check("Bucket", a.Bucket, s3BucketRE, "an S3 bucket name without dots")
	check("Key", a.Key, s3KeyRE, "an object key of [A-Za-z0-9._-] segments")
	check("VersionID", a.VersionID, versionIDRE, "an S3 version id")
	check("SHA256", a.SHA256, sha256RE, "a sha256 in lowercase hex")
}

// addAgent adds the bootstrap that installs the node agent to a cloud-config: the script, its inputs and its
// oneshot unit, which the caller enables and starts (a unit that runs the agent Requires= and orders After= it).
// deadline is the script's own (nodeconfig.NodeAgentFetch and its siblings); the unit's hard timeout is derived
// from it with a margin, so that the script's one reason is what the journal shows.
func addAgent(cc *cloudConfig, a Agent, deadline time.Duration) error {
	env, err := envFile("fetch-agent.sh", map[string]string{
		"DYNK8S_AGENT_BUCKET":           a.Bucket,
		"DYNK8S_AGENT_KEY":              a.Key,
		"DYNK8S_AGENT_VERSION_ID":       a.VersionID,
		"DYNK8S_AGENT_SHA256":           a.SHA256,
		"DYNK8S_AGENT_DEADLINE_SECONDS": strconv.Itoa(int(deadline / time.Second)),
	})
	if err != nil {
		return err
	}
	unit, err := agentUnit(deadline).marshal()
	if err != nil {
		return fmt.Errorf("agent unit: %w", err)
	}
	cc.WriteFiles = append(cc.WriteFiles,
		writeFile{Path: agentEnvPath, Content: env, Permissions: "0644"},
		writeFile{Path: agentScript, Content: forUserData(fetchAgentSh), Permissions: "0755"},
		writeFile{Path: "/etc/systemd/system/" + agentUnitName, Content: unit, Permissions: "0644"},
	)
	return nil
}

func agentUnit(deadline time.Duration) unitFile {
	return unitFile{
		{Name: "Unit", Entries: []unitEntry{
			{"Description", "dynk8s: install the node agent, hash-pinned, from the stack's S3 bucket"},
			{"Wants", "network-online.target"},
			{"After", "network-online.target"},
		}},
		{Name: "Service", Entries: []unitEntry{
			{"Type", "oneshot"},
			// Active once installed: the units that Require= it do not run it again.
			{"RemainAfterExit", "yes"},
			{"EnvironmentFile", agentEnvPath},
			{"ExecStart", agentScript},
			{"StandardOutput", "journal+console"},
			{"StandardError", "journal+console"},
			{"SyslogIdentifier", "dynk8s-agent"},
			{"TimeoutStartSec", unitSeconds(nodeconfig.AgentFetchUnitTimeout(deadline))},
		}},
		{Name: "Install", Entries: []unitEntry{
			{"WantedBy", "multi-user.target"},
		}},
	}
}
