package nodeconfig

import (
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"
)

// BakePath is where a bake's user data writes its configuration (Bake): a bake instance has no node.json.
const BakePath = "/etc/dynk8s/bake.json"

// BakeDeadline bounds a bake's prepare (its packages and pre-pulls, every network step retried until then): a
// node's join deadline is for a boot that has a cluster waiting, a bake has only its operator.
const BakeDeadline = 30 * time.Minute

// Bake is what the agent's bake command runs from: the fields of a pool's Node that its prepare step reads, and
// nothing of the join (no API server, gateway, CA pins or token parameter), so that the image a bake leaves is the
// same for every join the pool may later make, and its identity (cmd/bake's tag) changes only with what it holds.
type Bake struct {
	ClusterName    string   `json:"clusterName"`
	PoolName       string   `json:"poolName"`
	CRISocket      string   `json:"criSocket"`
	KernelModules  []string `json:"kernelModules"`
	Packages       []string `json:"packages"`
	Repos          []string `json:"repos"`
	SystemPackages []string `json:"systemPackages"`
	SystemRepos    []string `json:"systemRepos"`
	UpdateRepos    []string `json:"updateRepos"`
	PrePullImages  []string `json:"prePullImages"`
	// Deadline bounds the prepare (BakeDeadline).
	Deadline Duration `json:"deadline"`
}

// Bake is the part of n a bake of its pool runs from, with the prepare bounded by BakeDeadline.
func (n Node) Bake() Bake {
	return Bake{
		ClusterName: n.ClusterName, PoolName: n.PoolName, CRISocket: n.CRISocket,
		KernelModules: n.KernelModules, Packages: n.Packages, Repos: n.Repos,
		SystemPackages: n.SystemPackages, SystemRepos: n.SystemRepos, UpdateRepos: n.UpdateRepos,
		PrePullImages: n.PrePullImages, Deadline: Duration(BakeDeadline),
	}
}

// Node is the Node whose prepare step is b's: its prepare fields, the default backoffs, b's deadline as the join's,
// and nothing of the join. It is for the agent's prepare code, which reads a Node; it does not pass Validate.
func (b Bake) Node() Node {
	d := DefaultDeadlines
	d.Join = b.Deadline
	return Node{
		ClusterName: b.ClusterName, PoolName: b.PoolName, CRISocket: b.CRISocket,
		KernelModules: b.KernelModules, Packages: b.Packages, Repos: b.Repos,
		SystemPackages: b.SystemPackages, SystemRepos: b.SystemRepos, UpdateRepos: b.UpdateRepos,
		PrePullImages: b.PrePullImages, Deadlines: d,
	}
}

// DecodeBake reads a Bake strictly, as Decode reads a Node.
func DecodeBake(r io.Reader) (Bake, error) {
	var b Bake
	if err := decodeStrict(r, &b, "bake config"); err != nil {
		return Bake{}, err
	}
	if err := b.Validate(); err != nil {
		return Bake{}, err
	}
	return b, nil
}

// Encode writes b indented, keys in a fixed order: the same pool renders the same file, and the same image identity.
func (b Bake) Encode() ([]byte, error) {
	if err := b.Validate(); err != nil {
		return nil, err
	}
	out, err := json.MarshalIndent(b, "", " ")
	if err != nil {
		return nil, err
	}
	return append(out, '\n'), nil
}

// Validate checks that every value the prepare needs is there.
func (b Bake) Validate() error {
	var missing []string
	for key, v := range map[string]string{"clusterName": b.ClusterName, "poolName": b.PoolName, "criSocket": b.CRISocket} {
		if v == "" {
			missing = append(missing, key)
		}
	}
	if len(b.Packages) == 0 {
		missing = append(missing, "packages")
	}
	if b.Deadline <= 0 {
		missing = append(missing, "deadline (a positive duration)")
	}
	if len(missing) == 0 {
		return nil
	}
	slices.Sort(missing)
	return fmt.Errorf("bake config: missing or invalid: %s", strings.Join(missing, ", "))
}
