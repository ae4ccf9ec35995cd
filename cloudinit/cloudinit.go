// Package cloudinit renders dynk8s's EC2 user data: the cloud-config of a node pool, which installs pinned Kubernetes
// and CRI-O packages and joins the node with kubeadm, and the cloud-config of the WireGuard gateway.
//
// It is pure Go without Pulumi types: the stack calls it once per pool inside one apply. Documents are built from Go
// types and marshalled with sorted keys, so equal input gives byte-identical user data and a re-run of `pulumi up`
// changes nothing. Nothing secret is ever rendered: the join token and the gateway's private key are read from SSM
// at boot, by the embedded scripts, with the instance role.
package cloudinit

import (
	"bytes"
	"compress/gzip"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"

	"sigs.k8s.io/yaml"
)

// MaxUserDataBytes is the EC2 limit on raw user data (before base64).
const MaxUserDataBytes = 16384

// header must be the first line: cloud-init only treats user data that starts with it as cloud-config.
const header = "#cloud-config\n"

// maxDecodedBytes bounds Decode's output, so a malformed or hostile artifact cannot inflate without limit.
const maxDecodedBytes = 1 << 20

// cloudConfig holds the cloud-config modules dynk8s uses. Field order does not matter: sigs.k8s.io/yaml sorts keys.
type cloudConfig struct {
	// Packages are installed by cloud-init in its final stage, before runcmd runs.
	Packages []string `json:"packages,omitempty"`
	// RunCmd entries are argv lists (run with execve, no shell).
	RunCmd     [][]string         `json:"runcmd,omitempty"`
	WriteFiles []writeFile        `json:"write_files,omitempty"`
	YumRepos   map[string]yumRepo `json:"yum_repos,omitempty"`
}

type writeFile struct {
	Path    string `json:"path"`
	Content string `json:"content"`
	// Permissions is an octal string: cloud-init's schema rejects a YAML integer.
	Permissions string `json:"permissions"`
	// Defer writes the file in the final stage, after packages are installed (so a package's directory exists with
	// the package's own mode first).
	Defer bool `json:"defer,omitempty"`
}

// yumRepo becomes /etc/yum.repos.d/<id>.repo (cloud-init's yum_add_repo, config stage).
type yumRepo struct {
	Name     string `json:"name"`
	BaseURL  string `json:"baseurl"`
	Enabled  bool   `json:"enabled"`
	GPGCheck bool   `json:"gpgcheck"`
	GPGKey   string `json:"gpgkey"`
	// Priority: dnf picks a package from the repository with the lowest value among those that have it, "possibly
	// despite being less convenient otherwise (e.g. by being a lower version)" (dnf.conf(5), dnf5.conf(5)); 0: unset,
	// dnf's default 99.
	Priority int `json:"priority,omitempty"`
	// SkipIfUnavailable false: a repository dnf cannot reach fails the transaction instead of being left out of it
	// (dnf.conf(5), skip_if_unavailable). Fedora's dnf4 dnf.conf sets it true for every repository, and an image or
	// an operator may set it on dnf5, so the pinned repositories say it themselves.
	SkipIfUnavailable bool `json:"skip_if_unavailable"`
}

func (c cloudConfig) marshal() ([]byte, error) {
	files := append([]writeFile(nil), c.WriteFiles...)
	sort.Slice(files, func(i, j int) bool { return files[i].Path < files[j].Path })
	for i := 1; i < len(files); i++ {
		if files[i].Path == files[i-1].Path {
			return nil, fmt.Errorf("cloud-config: two write_files entries for %s", files[i].Path)
		}
	}
	c.WriteFiles = files
	body, err := yaml.Marshal(c)
	if err != nil {
		return nil, fmt.Errorf("cloud-config: marshal: %w", err)
	}
	return append([]byte(header), body...), nil
}

// Encode gzips user data (deterministically: no file name, zero mtime) and base64-encodes it, as a launch template's
// UserData wants. cloud-init recognises gzip and decompresses it. It refuses a result over MaxUserDataBytes, the EC2
// limit on the raw (pre-base64) bytes.
func Encode(userData []byte) (string, error) {
	var buf bytes.Buffer
	zw, err := gzip.NewWriterLevel(&buf, gzip.BestCompression)
	if err != nil {
		return "", fmt.Errorf("user data: gzip: %w", err)
	}
	if _, err := zw.Write(userData); err != nil {
		return "", fmt.Errorf("user data: gzip: %w", err)
	}
	if err := zw.Close(); err != nil {
		return "", fmt.Errorf("user data: gzip: %w", err)
	}
	if buf.Len() > MaxUserDataBytes {
		return "", fmt.Errorf("user data is %d bytes gzipped (%d raw), over the EC2 limit of %d bytes",
			buf.Len(), len(userData), MaxUserDataBytes)
	}
	return base64.StdEncoding.EncodeToString(buf.Bytes()), nil
}

// Decode reverses Encode: base64, then gunzip.
func Decode(encoded string) ([]byte, error) {
	raw, err := base64.StdEncoding.DecodeString(encoded)
	if err != nil {
		return nil, fmt.Errorf("user data: base64: %w", err)
	}
	zr, err := gzip.NewReader(bytes.NewReader(raw))
	if err != nil {
		return nil, fmt.Errorf("user data: not gzip: %w", err)
	}
	out, err := io.ReadAll(io.LimitReader(zr, maxDecodedBytes+1))
	if err != nil {
		return nil, fmt.Errorf("user data: gunzip: %w", err)
	}
	if len(out) > maxDecodedBytes {
		return nil, errors.New("user data: decompresses to more than 1 MiB")
	}
	if err := zr.Close(); err != nil {
		return nil, fmt.Errorf("user data: gunzip: %w", err)
	}
	return out, nil
}

// File is one file a rendered cloud-config writes on the instance.
type File struct {
	Path        string
	Content     string
	Permissions os.FileMode
	// Deferred files are written after cloud-init installs packages.
	Deferred bool
}

// WriteFiles writes the files of user data rendered by Node or Gateway under root, with their modes whatever the
// umask, as cloud-init's write_files does on the instance: the tests lay a node's files out so, and the agent takes
// that directory as DYNK8S_ROOT.
func WriteFiles(userData []byte, root string) error {
	files, err := Files(userData)
	if err != nil {
		return err
	}
	for _, f := range files {
		p := filepath.Join(root, f.Path)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(p, []byte(f.Content), f.Permissions); err != nil {
			return err
		}
		// WriteFile applies the mode only to a file it creates, and through the umask.
		if err := os.Chmod(p, f.Permissions); err != nil {
			return err
		}
	}
	return nil
}

// Files lists the files in user data rendered by Node or Gateway (not base64 or gzipped), in path order.
func Files(userData []byte) ([]File, error) {
	if !bytes.HasPrefix(userData, []byte(header)) {
		return nil, fmt.Errorf("user data does not start with %q", header)
	}
	var cc cloudConfig
	if err := yaml.UnmarshalStrict(userData, &cc); err != nil {
		return nil, fmt.Errorf("user data: %w", err)
	}
	files := make([]File, 0, len(cc.WriteFiles))
	for _, f := range cc.WriteFiles {
		mode, err := strconv.ParseUint(f.Permissions, 8, 12)
		if err != nil {
			return nil, fmt.Errorf("user data: %s: permissions %q: %w", f.Path, f.Permissions, err)
		}
		files = append(files, File{Path: f.Path, Content: f.Content, Permissions: os.FileMode(mode), Deferred: f.Defer})
	}
	sort.Slice(files, func(i, j int) bool { return files[i].Path < files[j].Path })
	return files, nil
}
