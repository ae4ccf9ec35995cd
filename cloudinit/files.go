package cloudinit

import (
	"bytes"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/BurntSushi/toml"
)

// envKeyRE and envValueRE are the bootstrap's environment file (agent.env, systemd's EnvironmentFile=): a value
// alphabet with no quotes, whitespace, '$', '`' or '\' that systemd's parser or the script could read otherwise.
var (
	envKeyRE   = regexp.MustCompile(`^DYNK8S_[A-Z0-9_]+$`)
	envValueRE = regexp.MustCompile(`^[][A-Za-z0-9_.,:/*@+=-]*$`)
)

// envFile renders KEY=value lines for the script named reader, sorted by key.
func envFile(reader string, vars map[string]string) (string, error) {
	keys := slices.Sorted(maps.Keys(vars))
	var b strings.Builder
	for _, k := range keys {
		v := vars[k]
		if !envKeyRE.MatchString(k) {
			return "", fmt.Errorf("env file for %s: bad key %q", reader, k)
		}
		if !envValueRE.MatchString(v) {
			return "", fmt.Errorf("env file for %s: %s=%q has a character outside [A-Za-z0-9_.,:/*@+=[]-]", reader, k, v)
		}
		b.WriteString(k + "=" + v + "\n")
	}
	return b.String(), nil
}

// unitSeconds is a unit's timeout setting ("840s") for d, whole seconds.
func unitSeconds(d time.Duration) string { return strconv.Itoa(int(d/time.Second)) + "s" }

// unitFile is a systemd unit or drop-in: sections in the given order, each with its keys in the given order (a key
// may repeat, as ExecStartPre does).
type unitFile []unitSection

type unitSection struct {
	Name    string
	Entries []unitEntry
}

type unitEntry struct{ Key, Value string }

var unitKeyRE = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9]*$`)

func (u unitFile) marshal() (string, error) {
	var b strings.Builder
	for i, s := range u {
		if !unitKeyRE.MatchString(s.Name) {
			return "", fmt.Errorf("unit file: bad section name %q", s.Name)
		}
		if i > 0 {
			b.WriteByte('\n')
		}
		b.WriteString("[" + s.Name + "]\n")
		for _, e := range s.Entries {
			if !unitKeyRE.MatchString(e.Key) {
				return "", fmt.Errorf("unit file: [%s]: bad key %q", s.Name, e.Key)
			}
			// A line break would end the value; a trailing backslash would continue it onto the next key.
			if strings.ContainsAny(e.Value, "\r\n") || strings.HasSuffix(e.Value, `\`) {
				return "", fmt.Errorf("unit file: [%s] %s: value %q would not stay on one line", s.Name, e.Key, e.Value)
			}
			b.WriteString(e.Key + "=" + e.Value + "\n")
		}
	}
	return b.String(), nil
}

// sysctlFile renders "key = value" lines for /etc/sysctl.d, sorted by key.
func sysctlFile(settings map[string]string) string {
	keys := slices.Sorted(maps.Keys(settings))
	var b strings.Builder
	for _, k := range keys {
		b.WriteString(k + " = " + settings[k] + "\n")
	}
	return b.String()
}

// crioDropIn is the subset of crio.conf(5) dynk8s sets. It lives in /etc/crio/crio.conf.d, named to sort after the
// package's own 10-crio.conf: crio.conf itself is replaced on package changes.
type crioDropIn struct {
	Crio struct {
		Image struct {
			PauseImage string `toml:"pause_image"`
		} `toml:"image"`
		Network struct {
			PluginDirs []string `toml:"plugin_dirs"`
		} `toml:"network"`
		Runtime struct {
			CgroupManager string `toml:"cgroup_manager"`
			// SELinux is written out even when false: CRI-O's default (false) is documented as deprecated and to
			// follow the host's SELinux mode in a future release, which on Fedora (enforcing) would silently
			// confine every pod as container_t and break the fuse device plugin's socket in a hostPath.
			SELinux bool `toml:"selinux"`
		} `toml:"runtime"`
	} `toml:"crio"`
}

func (c crioDropIn) marshal() (string, error) {
	var b bytes.Buffer
	enc := toml.NewEncoder(&b)
	enc.Indent = ""
	if err := enc.Encode(c); err != nil {
		return "", fmt.Errorf("crio drop-in: %w", err)
	}
	return b.String(), nil
}

// forUserData drops a script's comment lines (all but the shebang) before it goes into user data, where bytes count
// against EC2's 16 KiB limit; the repository keeps the commented source.
// So the scripts must not have a line starting with '#' inside a multi-line string or heredoc; the tests run
// shellcheck and the behaviour tests on the stripped text.
func forUserData(script string) string {
	lines := strings.SplitAfter(script, "\n")
	var b strings.Builder
	for i, l := range lines {
		if i > 0 && strings.HasPrefix(strings.TrimLeft(l, " \t"), "#") {
			continue
		}
		b.WriteString(l)
	}
	return b.String()
}
