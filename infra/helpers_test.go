package infra_test

import (
	"strings"
	"testing"

	"gotest.tools/v3/assert"

	"github.com/dynk8s/dynk8s/cloudinit"
	"github.com/dynk8s/dynk8s/cmd/plan/mockcloud"
	"github.com/dynk8s/dynk8s/infra/config"
	"github.com/dynk8s/dynk8s/node/nodeconfig"
)

// devConfig is Pulumi.dev.yaml's config map, read afresh each call.
func devConfig(t *testing.T) map[string]any {
	t.Helper()
	values, err := config.ReadStackFile("../Pulumi.dev.yaml")
	assert.NilError(t, err)
	return values
}

var (
	obj  = mockcloud.Object
	pool = mockcloud.Pool
)

// poolNodeConfig is the node agent's configuration a pool's launch template carries (/etc/dynk8s/node.json of its
// user data), decoded as the agent decodes it.
func poolNodeConfig(t *testing.T, lt *mockcloud.Resource) nodeconfig.Node {
	t.Helper()
	raw, err := cloudinit.Decode(in(lt, "userData").(string))
	assert.NilError(t, err)
	files, err := cloudinit.Files(raw)
	assert.NilError(t, err)
	for _, f := range files {
		if f.Path == "/etc/dynk8s/node.json" {
			n, err := nodeconfig.Decode(strings.NewReader(f.Content))
			assert.NilError(t, err, "%s: node.json", lt.Name)
			return n
		}
	}
	t.Fatalf("%s: the user data has no /etc/dynk8s/node.json", lt.Name)
	return nodeconfig.Node{}
}
