//go:build e2e

package e2e

import (
	"archive/tar"
	"bytes"
	"io"
	"maps"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"gotest.tools/v3/assert"
)

// No image can be pulled here, so the pods of a box run images the test builds and imports into the box's runtime
// before its kubelet starts, each tagged with the name the stack's manifests (or the rendered CRI-O config) give it.
// Each is one layer of the files its container runs, nothing else.

// podImage is one image: its name, its default command, and its files (path in the image: file on this machine).
type podImage struct {
	ref        string
	entrypoint []string
	files      map[string]string
}

// staticBinary builds a main package of this repository (CGO off: it runs in an image with no libc) into dir.
func staticBinary(t *testing.T, pkg, dir string) string {
	t.Helper()
	out := filepath.Join(dir, path.Base(pkg))
	cmd := exec.Command("go", "build", "-trimpath", "-o", out, pkg)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build %s: %v\n%s", pkg, err, b)
	}
	return out
}

// archive writes the image as a docker-archive tarball (what `ctr images import` reads) to file.
func (img podImage) archive(t *testing.T, file string) {
	t.Helper()
	layerTar := imageLayer(t, img.files)
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar)), nil
	})
	assert.NilError(t, err)
	i, err := mutate.AppendLayers(empty.Image, layer)
	assert.NilError(t, err)
	cf, err := i.ConfigFile()
	assert.NilError(t, err)
	cf = cf.DeepCopy()
	cf.Architecture, cf.OS = runtime.GOARCH, "linux"
	cf.Config = v1.Config{Entrypoint: img.entrypoint, Env: []string{"PATH=/usr/local/bin:/usr/bin:/bin"}}
	if i, err = mutate.ConfigFile(i, cf); err != nil {
		t.Fatal(err)
	}
	tag, err := name.NewTag(img.ref)
	assert.NilError(t, err, "image name %s", img.ref)
	assert.NilError(t, tarball.WriteToFile(file, tag, i), "write %s", file)
}

// imageLayer is a tar of files (image path: source), with their parent directories, owned by root, in a stable order.
func imageLayer(t *testing.T, files map[string]string) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	dirs := map[string]bool{}
	for _, p := range slices.Sorted(maps.Keys(files)) {
		for d := path.Dir(p); d != "/" && !dirs[d]; d = path.Dir(d) {
			dirs[d] = true
		}
	}
	for _, d := range slices.Sorted(maps.Keys(dirs)) {
		assert.NilError(t, tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: strings.TrimPrefix(d, "/") + "/",
			Mode: 0o755}))
	}
	for _, p := range slices.Sorted(maps.Keys(files)) {
		content, err := os.ReadFile(files[p])
		assert.NilError(t, err)
		assert.NilError(t, tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: strings.TrimPrefix(p, "/"), Mode: 0o755,
			Size: int64(len(content))}))
		if _, err := tw.Write(content); err != nil {
			t.Fatal(err)
		}
	}
	assert.NilError(t, tw.Close())
	return buf.Bytes()
}
