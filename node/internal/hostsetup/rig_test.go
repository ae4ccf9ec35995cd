package hostsetup

import (
	"bytes"
	"context"
	"net/netip"
	"testing"
	"time"

	"github.com/dynk8s/dynk8s/node/internal/system"
	"github.com/dynk8s/dynk8s/node/nodeconfig"
	"github.com/dynk8s/dynk8s/node/nodetest"
)

// hostRig is a node's root, its host settings (node.json's host), a host that records the commands it is given,
// and what the last run logged.
type hostRig struct {
	root string
	cfg  nodeconfig.Node
	host *recordingHost
	log  *bytes.Buffer
}

func newHostRig(t *testing.T) *hostRig {
	return &hostRig{root: t.TempDir(), host: &recordingHost{fail: map[string]bool{}}, log: &bytes.Buffer{},
		cfg: nodeconfig.Node{Host: nodeconfig.Host{OnPremCIDRs: []netip.Prefix{netip.MustParsePrefix("192.168.0.0/16")},
			TunnelMTU: 1420, MetadataUIDs: []int{1000}}}}
}

// recordingHost records each command line; those in fail exit 1.
type recordingHost struct {
	nodetest.Calls
	fail map[string]bool
}

func (h *recordingHost) Run(_ context.Context, _ time.Duration, _ bool, name string, args ...string) error {
	if line := h.Record(name, args); h.fail[line] {
		return &system.ExitError{Name: name, Code: 1}
	}
	return nil
}

func (h *recordingHost) Output(ctx context.Context, timeout time.Duration, name string, args ...string) (string, error) {
	return "", h.Run(ctx, timeout, true, name, args...)
}

func (h *recordingHost) Has(string) bool { return true }
