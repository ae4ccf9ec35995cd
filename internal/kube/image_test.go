package kube

import (
	"strings"
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
)

func TestNormalizeImage(t *testing.T) {
	t.Parallel()
	digest := "sha256:" + strings.Repeat("0f", 32)
	for in, want := range map[string]string{
		"busybox":                           "docker.io/library/busybox:latest",
		"jenkins/inbound-agent:3.1":         "docker.io/jenkins/inbound-agent:3.1",
		"registry.k8s.io/pause:3.10.1":      "registry.k8s.io/pause:3.10.1",
		"quay.io/a/b@" + digest:             "quay.io/a/b@" + digest,
		"localhost:5000/x/y:1":              "localhost:5000/x/y:1",
		"registry.example.com:443/team/app": "registry.example.com:443/team/app:latest",
	} {
		got, err := NormalizeImage(in)
		assert.Check(t, err, in)
		assert.Check(t, is.Equal(got, want))
	}
	for _, bad := range []string{"", "Busybox", "a b", "quay.io/a:b:c", "x@sha256:00", "-x"} {
		_, err := NormalizeImage(bad)
		assert.Check(t, is.ErrorContains(err, "is not an image reference"), "%q", bad)
	}
}
