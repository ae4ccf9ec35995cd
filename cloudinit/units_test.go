package cloudinit

import (
	"bufio"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/dynk8s/dynk8s/internal/testkit/realtools"
)

// unitDir is where the user data writes its units and drop-ins.
const unitDir = "/etc/systemd/system/"

// parsedUnit is a unit (or a drop-in) as systemd reads it: each key's values in order, a list-valued key such as
// After= split on blanks.
type parsedUnit map[string][]string // "Section.Key" -> values

func parseUnit(t *testing.T, name, content string) parsedUnit {
	t.Helper()
	u := parsedUnit{}
	section := ""
	sc := bufio.NewScanner(strings.NewReader(content))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "" || strings.HasPrefix(line, "#") || strings.HasPrefix(line, ";"):
		case strings.HasPrefix(line, "[") && strings.HasSuffix(line, "]"):
			section = line[1 : len(line)-1]
		default:
			k, v, ok := strings.Cut(line, "=")
			if !ok || section == "" {
				t.Fatalf("%s: not a unit file line: %q", name, line)
			}
			u[section+"."+k] = append(u[section+"."+k], strings.Fields(v)...)
		}
	}
	return u
}

// writtenUnits are the units the user data writes, with the drop-ins it writes merged into the unit they extend
// (wg-quick@wg0.service.d/10-dynk8s.conf extends wg-quick@wg0.service), keyed by unit name.
func writtenUnits(t *testing.T, userData []byte) map[string]parsedUnit {
	t.Helper()
	files, err := Files(userData)
	assert.NilError(t, err)
	units := map[string]parsedUnit{}
	for _, f := range files {
		rel, ok := strings.CutPrefix(f.Path, unitDir)
		if !ok {
			continue
		}
		name := rel
		if dir, _, isDropIn := strings.Cut(rel, ".d/"); isDropIn {
			name = dir
		}
		if units[name] == nil {
			units[name] = parsedUnit{}
		}
		for k, v := range parseUnit(t, f.Path, f.Content) {
			units[name][k] = append(units[name][k], v...)
		}
	}
	return units
}

// orderedAfter returns, for each unit, the units it is ordered after (systemd.unit(5): A Before=B is B After=A),
// from the units given; units outside them (kubelet.service, from its package) appear through the others' edges.
func orderedAfter(units map[string]parsedUnit) map[string][]string {
	after := map[string][]string{}
	for _, name := range slices.Sorted(maps.Keys(units)) {
		u := units[name]
		after[name] = append(after[name], u["Unit.After"]...)
		for _, b := range u["Unit.Before"] {
			after[b] = append(after[b], name)
		}
	}
	return after
}

// orderingChain returns a chain of After= edges from unit to target (unit, ..., target) when unit is ordered after
// target, directly or through other units, and nil when it is not.
func orderingChain(after map[string][]string, unit, target string) []string {
	seen := map[string]bool{}
	var walk func(u string) []string
	walk = func(u string) []string {
		if u == target {
			return []string{u}
		}
		if seen[u] {
			return nil
		}
		seen[u] = true
		for _, prev := range after[u] {
			if chain := walk(prev); chain != nil {
				return append([]string{u}, chain...)
			}
		}
		return nil
	}
	return walk(unit)
}

// startedByTheJoin are the units the join unit starts and waits for while it runs: the agent's `systemctl start
// crio.service` (and `enable --now`), and kubeadm join's kubelet-start phase, whose TryStartKubelet runs a blocking
// `systemctl restart kubelet` (kubernetes/kubernetes cmd/kubeadm/app/phases/kubelet/kubelet.go; initsystem's
// ServiceRestart has no --no-block). On a boot whose transaction holds a start job for such a unit (a warm pool's
// Stopped instance entering service: the first boot enabled kubelet and crio), that job starts only after every
// unit it is ordered after has finished its own job (systemd.unit(5), Before=/After= order jobs, not units). If one
// of those is ordered after the join unit, the join waits on itself: systemd sees no cycle, and kubeadm hangs until
// the join's deadline.
var startedByTheJoin = []string{"kubelet.service", "crio.service"}

// No unit the join waits for may be ordered after the join unit, directly or through another unit: the ordering
// rule whose breach (the metadata lock After= the join and Before= the kubelet) deadlocks a Stopped warm instance's
// kubeadm join.
func TestNodeUnitsNeverOrderWhatTheJoinStartsAfterTheJoin(t *testing.T) {
	t.Parallel()
	for name, ud := range renderedNodeUserData(t) {
		t.Run(name, func(t *testing.T) {
			after := orderedAfter(writtenUnits(t, ud))
			assert.Assert(t, len(after[joinUnitName]) > 0, "the user data writes no %s", joinUnitName)
			for _, u := range startedByTheJoin {
				chain := orderingChain(after, u, joinUnitName)
				assert.Check(t, chain == nil, "%s is ordered after %s: %s", u, joinUnitName,
					strings.Join(chain, " After= "))
			}
		})
	}
}

// The check above finds the ordering that deadlocked a Stopped warm instance, so its pass means something.
func TestOrderingChainFindsTheWarmPoolDeadlock(t *testing.T) {
	t.Parallel()
	units := map[string]parsedUnit{
		joinUnitName: parseUnit(t, "join", "[Unit]\nAfter=network-online.target\n"),
		imdsUnitName: parseUnit(t, "lock", "[Unit]\nAfter="+joinUnitName+"\nBefore=kubelet.service\n"),
	}
	assert.Check(t, is.DeepEqual(orderingChain(orderedAfter(units), "kubelet.service", joinUnitName),
		[]string{"kubelet.service", imdsUnitName, joinUnitName}))
	units[imdsUnitName] = parseUnit(t, "lock", "[Unit]\nBefore=kubelet.service\n")
	assert.Check(t, is.Nil(orderingChain(orderedAfter(units), "kubelet.service", joinUnitName)))
}

// renderedNodeUserData is every node variant the tests render: a pool without a warm pool, a spot pool with on-prem
// DNS, and a pool with a launch hook (its warm-pool join timer).
func renderedNodeUserData(t *testing.T) map[string][]byte {
	t.Helper()
	out := map[string][]byte{}
	warm := generalPool()
	warm.node.LaunchHook = "dynk8s-launch"
	for name, in := range map[string]pool{"node-general": generalPool(), "node-spot-arm64": spotPool(),
		"node-warm": warm} {
		ud, err := in.userData()
		assert.NilError(t, err)
		out[name] = ud
	}
	return out
}

// fedoraCommands are the commands the written units run that the user data does not write: the packages' (the
// kubelet's unit runs the kubelet; wireguard-tools' wg-quick@.service runs wg-quick, wg and bash). The verify root
// gets an executable placeholder at each of these paths, and only at these, with /bin a link to usr/bin as on
// Fedora (merged /usr): a unit naming any other path outside the user data fails the check.
// The agent is among them: the bootstrap installs it at boot.
var fedoraCommands = []string{"/usr/bin/kubelet", "/usr/bin/wg-quick", "/usr/bin/wg", "/usr/bin/bash", agentBinary}

// kubeletPackageUnit is the unit the kubelet package installs (kubernetes/release,
// cmd/krel/templates/latest/kubelet/kubelet.service), which the node's drop-in extends.
const kubeletPackageUnit = `[Unit]
Description=kubelet: The Kubernetes Node Agent
Documentation=https://kubernetes.io/docs/
Wants=network-online.target
After=network-online.target

[Service]
ExecStart=/usr/bin/kubelet
Restart=always
StartLimitInterval=0
RestartSec=10

[Install]
WantedBy=multi-user.target
`

// hostUnitsDir holds the units systemd itself ships (the targets every unit orders against) and wireguard-tools'
// wg-quick@.service, which the gateway's drop-in extends.
const hostUnitsDir = "/usr/lib/systemd/system"

// systemd-analyze verify accepts every unit the user data writes, in a root that holds the user data's files (their
// modes included: a script that is not executable fails), systemd's own units and the image's commands: it loads
// each unit with its drop-ins, checks each key it knows, resolves each command, and builds the start transaction.
// Anything it says fails the test: an unknown key or a bad value is only a warning to systemd.
func TestSystemdAnalyzeVerify(t *testing.T) {
	t.Parallel()
	sa := realtools.Require(t, "systemd-analyze")
	for _, need := range []string{"sysinit.target", "network-online.target", "wg-quick@.service"} {
		if _, err := os.Stat(filepath.Join(hostUnitsDir, need)); err != nil {
			realtools.Missing(t, "the host's "+need+" ("+err.Error()+")")
		}
	}
	for name, ud := range renderedUserData(t) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			root := verifyRoot(t, ud)
			units := slices.Sorted(maps.Keys(writtenUnits(t, ud)))
			assert.Assert(t, len(units) > 0)
			out, err := exec.Command(sa, append([]string{"verify", "--man=no", "--root=" + root}, units...)...).CombinedOutput()
			assert.NilError(t, err, "systemd-analyze verify %s:\n%s", strings.Join(units, " "), out)
			assert.Check(t, is.Equal(string(out), ""), "systemd-analyze verify %s", strings.Join(units, " "))
		})
	}
}

// The verifier really rejects what it should, so a pass above means something: a unit whose script is not
// executable, and (as output) a key systemd does not know.
func TestSystemdAnalyzeVerifyRejectsBadUnits(t *testing.T) {
	t.Parallel()
	sa := realtools.Require(t, "systemd-analyze")
	if _, err := os.Stat(filepath.Join(hostUnitsDir, "sysinit.target")); err != nil {
		realtools.Missing(t, "the host's sysinit.target ("+err.Error()+")")
	}
	ud, err := generalPool().userData()
	assert.NilError(t, err)
	root := verifyRoot(t, ud)
	assert.NilError(t, os.Chmod(filepath.Join(root, agentBinary), 0o644))
	out, err := exec.Command(sa, "verify", "--man=no", "--root="+root, joinUnitName).CombinedOutput()
	assert.Assert(t, err != nil, "verify accepted an agent that is not executable: %s", out)
	assert.Check(t, is.Contains(string(out), "is not executable"))

	unit := filepath.Join(root, unitDir, routesUnitName)
	body, err := os.ReadFile(unit)
	assert.NilError(t, err)
	assert.NilError(t, os.WriteFile(unit, []byte(strings.Replace(string(body), "Before=", "Befor=", 1)), 0o644))
	out, _ = exec.Command(sa, "verify", "--man=no", "--root="+root, routesUnitName).CombinedOutput()
	assert.Check(t, is.Contains(string(out), "Unknown key 'Befor'"))
}

// verifyRoot is a directory systemd-analyze can take as the node's root: the user data's files, the host's systemd
// units, the kubelet package's unit and a placeholder for each of fedoraCommands.
func verifyRoot(t *testing.T, userData []byte) string {
	t.Helper()
	root := t.TempDir()
	materialize(t, userData, root)
	units := filepath.Join(root, hostUnitsDir)
	assert.NilError(t, os.MkdirAll(filepath.Dir(units), 0o755))
	out, err := exec.Command("cp", "-a", hostUnitsDir, units).CombinedOutput()
	assert.NilError(t, err, "copy the host's units: %s", out)
	assert.NilError(t, os.WriteFile(filepath.Join(units, "kubelet.service"), []byte(kubeletPackageUnit), 0o644))
	assert.NilError(t, os.Symlink("usr/bin", filepath.Join(root, "bin")))
	for _, c := range fedoraCommands {
		p := filepath.Join(root, c)
		assert.NilError(t, os.MkdirAll(filepath.Dir(p), 0o755))
		assert.NilError(t, os.WriteFile(p, []byte("#!/bin/sh\nexit 0\n"), 0o755))
	}
	return root
}
