package cloudinit

import (
	"bytes"
	"compress/gzip"
	"crypto/rand"
	"encoding/base64"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
)

func TestEncodeDecodeRoundTrip(t *testing.T) {
	t.Parallel()
	ud, err := generalPool().userData()
	assert.NilError(t, err)
	enc, err := Encode(ud)
	assert.NilError(t, err)
	dec, err := Decode(enc)
	assert.NilError(t, err)
	assert.DeepEqual(t, dec, ud)
}

// Launch template user data must not change between runs with equal input, or every `pulumi up` makes a new
// launch template version: gzip must carry no mtime or name.
func TestEncodeIsDeterministic(t *testing.T) {
	t.Parallel()
	ud := []byte(header + "runcmd: [[true]]\n")
	a, err := Encode(ud)
	assert.NilError(t, err)
	b, err := Encode(ud)
	assert.NilError(t, err)
	assert.Equal(t, a, b)

	raw, err := base64.StdEncoding.DecodeString(a)
	assert.NilError(t, err)
	zr, err := gzip.NewReader(bytes.NewReader(raw))
	assert.NilError(t, err)
	assert.Check(t, zr.ModTime.IsZero(), "gzip header has an mtime: %v", zr.ModTime)
	assert.Check(t, is.Equal(zr.Name, ""))
}

func TestEncodeRefusesOversizedUserData(t *testing.T) {
	t.Parallel()
	// Random bytes do not compress, so the gzip stream is larger than the input.
	big := make([]byte, MaxUserDataBytes)
	_, err := rand.Read(big)
	assert.NilError(t, err)
	_, err = Encode(big)
	assert.ErrorContains(t, err, "over the EC2 limit of 16384 bytes")
	assert.ErrorContains(t, err, "bytes gzipped")

	// Highly compressible data far over 16 KiB raw is fine: the limit applies to what EC2 receives.
	_, err = Encode(bytes.Repeat([]byte("a"), 10*MaxUserDataBytes))
	assert.NilError(t, err)
}

func TestDecodeRejectsGarbage(t *testing.T) {
	t.Parallel()
	_, err := Decode("not base64!")
	assert.ErrorContains(t, err, "base64")
	_, err = Decode(base64.StdEncoding.EncodeToString([]byte(header)))
	assert.ErrorContains(t, err, "not gzip")

	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	_, err = zw.Write([]byte(strings.Repeat("x", maxDecodedBytes+1)))
	assert.NilError(t, err)
	assert.NilError(t, zw.Close())
	_, err = Decode(base64.StdEncoding.EncodeToString(buf.Bytes()))
	assert.ErrorContains(t, err, "more than 1 MiB")
}

func TestFilesListsWhatCloudInitWrites(t *testing.T) {
	t.Parallel()
	ud, err := generalPool().userData()
	assert.NilError(t, err)
	files, err := Files(ud)
	assert.NilError(t, err)
	var paths []string
	for _, f := range files {
		paths = append(paths, f.Path)
	}
	assert.DeepEqual(t, paths, []string{
		"/etc/NetworkManager/conf.d/90-dynk8s-cni.conf", "/etc/crio/crio.conf.d/90-dynk8s.conf", "/etc/dynk8s/agent.env",
		"/etc/dynk8s/node.json",
		"/etc/kubernetes/patches/kubeletconfiguration+merge.yaml", "/etc/modules-load.d/dynk8s.conf", "/etc/sysctl.d/90-dynk8s.conf",
		"/etc/systemd/system/dynk8s-agent.service", "/etc/systemd/system/dynk8s-imds-lock.service",
		"/etc/systemd/system/dynk8s-join.service",
		"/etc/systemd/system/dynk8s-onprem-routes.service", "/etc/systemd/system/kubelet.service.d/90-dynk8s-imds-lock.conf",
		"/etc/systemd/zram-generator.conf",
		"/usr/local/libexec/dynk8s/fetch-agent.sh",
	})
	for _, f := range files {
		if f.Path == "/usr/local/libexec/dynk8s/fetch-agent.sh" {
			assert.Check(t, is.Equal(f.Permissions, os.FileMode(0o755)))
		}
	}

	_, err = Files([]byte("#!/bin/sh\n"))
	assert.ErrorContains(t, err, "does not start with")
}

// WriteFiles gives each file its mode even where a file is already there with another (os.WriteFile keeps an
// existing file's mode), as cloud-init's write_files does: the gateway's wg0.conf is 0600 whatever was there.
func TestWriteFilesSetsTheModes(t *testing.T) {
	t.Parallel()
	ud, err := Gateway(testGateway())
	assert.NilError(t, err)
	root := t.TempDir()
	conf := filepath.Join(root, "etc/wireguard/wg0.conf")
	assert.NilError(t, os.MkdirAll(filepath.Dir(conf), 0o755))
	assert.NilError(t, os.WriteFile(conf, []byte("old"), 0o644))
	assert.NilError(t, WriteFiles(ud, root))
	files, err := Files(ud)
	assert.NilError(t, err)
	for _, f := range files {
		st, err := os.Stat(filepath.Join(root, f.Path))
		assert.NilError(t, err)
		assert.Check(t, is.Equal(st.Mode().Perm(), f.Permissions.Perm()), f.Path)
	}
	b, err := os.ReadFile(conf)
	assert.NilError(t, err)
	assert.Check(t, strings.HasPrefix(string(b), "[Interface]"))
}
