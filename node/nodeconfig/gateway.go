package nodeconfig

import (
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"
)

// GatewayPath is where cloud-init writes the WireGuard gateway's configuration.
const GatewayPath = "/etc/dynk8s/gateway.json"

// GatewayPeerKeepalive is the keepalive the gateway gives the on-prem peer it dials after a stop: the stack's
// wireguard.PersistentKeepalive (25 s, wg(8)'s advice for a peer behind NAT), which the agent may not import.
const GatewayPeerKeepalive = 25 * time.Second

// Gateway is what the agent's gateway commands need (gateway-key, gateway-packages, gateway-idle): the gateway's
// counterpart of Node, written by the renderer (cloudinit.Gateway) and decoded strictly at boot. All values are
// public: the private key is read from SSM at boot, never written here.
type Gateway struct {
	// KeyParameter is the SSM SecureString holding the gateway's WireGuard private key.
	KeyParameter string `json:"keyParameter"`
	// KeyFile is where gateway-key puts the key (0600), which wg-quick's PostUp loads.
	KeyFile string `json:"keyFile"`
	// Packages are installed from Fedora's repositories where rpm does not find them: from SystemRepos (the
	// release's) on the first attempt, from every enabled repository after that.
	Packages    []string `json:"packages"`
	SystemRepos []string `json:"systemRepos"`
	// TunnelUnit is the unit gateway-packages enables and starts once the packages are there (wg-quick@wg0).
	TunnelUnit string `json:"tunnelUnit"`
	// Idle is the idle check's (gateway.idleStop); nil: the gateway never stops itself.
	Idle *GatewayIdle `json:"idle,omitempty"`
	// Deadlines bound each command's run.
	Deadlines GatewayDeadlines `json:"deadlines"`
}

// GatewayIdle is what the idle check looks at.
type GatewayIdle struct {
	// ClusterName is the names.TagCluster value of the pool instances that keep the gateway up.
	ClusterName string `json:"clusterName"`
	// Stop is how long the gateway stays up with no pool instance pending or running and no packet forwarded.
	Stop Duration `json:"stop"`
	// NFTTable is the nftables table (family inet) whose named counters count the packets forwarded through wg0.
	NFTTable string `json:"nftTable"`
}

// GatewayDeadlines are the gateway commands' time limits; each unit's TimeoutStartSec is derived from its own.
type GatewayDeadlines struct {
	// Key bounds gateway-key when no key is on disk yet (a first boot: the tunnel cannot come up without it);
	// KeyOnDisk when there is one (SSM gets a short try, then the key on disk is used).
	Key       Duration `json:"key"`
	KeyOnDisk Duration `json:"keyOnDisk"`
	// Packages bounds gateway-packages' install.
	Packages Duration `json:"packages"`
	// Idle bounds one idle check, well inside the timer's minute.
	Idle Duration `json:"idle"`
	// BackoffInitial and BackoffMax bound the exponential pause between a step's attempts.
	BackoffInitial Duration `json:"backoffInitial"`
	BackoffMax     Duration `json:"backoffMax"`
}

// DefaultGatewayDeadlines are the gateway commands' defaults.
var DefaultGatewayDeadlines = GatewayDeadlines{
	Key:            Duration(10 * time.Minute),
	KeyOnDisk:      Duration(45 * time.Second),
	Packages:       Duration(10 * time.Minute),
	Idle:           Duration(45 * time.Second),
	BackoffInitial: Duration(time.Second),
	BackoffMax:     Duration(5 * time.Second),
}

// idleUnitSlack is what the idle unit's hard timeout adds to the check's deadline: room for the last attempt, and
// still short of the timer's next run a minute later.
const idleUnitSlack = 10 * time.Second

// KeyUnitTimeout is the hard timeout of wg-quick@wg0's start (gateway-key is its ExecStartPre): the first boot's
// deadline and UnitSlack.
func (d GatewayDeadlines) KeyUnitTimeout() time.Duration { return d.Key.D() + UnitSlack }

// PackagesUnitTimeout is the packages unit's hard timeout.
func (d GatewayDeadlines) PackagesUnitTimeout() time.Duration { return d.Packages.D() + UnitSlack }

// IdleUnitTimeout is the idle unit's hard timeout.
func (d GatewayDeadlines) IdleUnitTimeout() time.Duration { return d.Idle.D() + idleUnitSlack }

// DecodeGateway reads a Gateway as strictly as Decode reads a Node.
func DecodeGateway(r io.Reader) (Gateway, error) {
	var g Gateway
	if err := decodeStrict(r, &g, "gateway config"); err != nil {
		return Gateway{}, err
	}
	if err := g.Validate(); err != nil {
		return Gateway{}, err
	}
	return g, nil
}

// Encode writes g as the renderer puts it in user data: indented, keys in a fixed order.
func (g Gateway) Encode() ([]byte, error) {
	if err := g.Validate(); err != nil {
		return nil, err
	}
	b, err := json.MarshalIndent(g, "", " ")
	if err != nil {
		return nil, err
	}
	return append(b, '\n'), nil
}

// Validate checks that every value the gateway's commands need is there.
func (g Gateway) Validate() error {
	var missing []string
	strs := map[string]string{"keyParameter": g.KeyParameter, "keyFile": g.KeyFile, "tunnelUnit": g.TunnelUnit}
	if g.Idle != nil {
		strs["idle.clusterName"], strs["idle.nftTable"] = g.Idle.ClusterName, g.Idle.NFTTable
		if g.Idle.Stop <= 0 {
			missing = append(missing, "idle.stop (a positive duration)")
		}
	}
	for key, v := range strs {
		if v == "" {
			missing = append(missing, key)
		}
	}
	if len(g.Packages) == 0 {
		missing = append(missing, "packages")
	}
	d := g.Deadlines
	for key, v := range map[string]Duration{"deadlines.key": d.Key, "deadlines.keyOnDisk": d.KeyOnDisk,
		"deadlines.packages": d.Packages, "deadlines.idle": d.Idle, "deadlines.backoffInitial": d.BackoffInitial,
		"deadlines.backoffMax": d.BackoffMax} {
		if v <= 0 {
			missing = append(missing, key+" (a positive duration)")
		}
	}
	if len(missing) == 0 {
		return nil
	}
	slices.Sort(missing)
	return fmt.Errorf("gateway config: missing or invalid: %s", strings.Join(missing, ", "))
}
