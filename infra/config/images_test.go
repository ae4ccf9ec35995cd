package config_test

import (
	"testing"

	"gotest.tools/v3/assert"
)

// TestImagesParsed: images.* take any reference the runtimes parse, digests included, and refuse one they would
// not (a malformed digest never reaches a node or a pod spec).
func TestImagesParsed(t *testing.T) {
	pinned := "mirror.example.com/k8s@sha256:" + "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	c := devConfig(t)
	c["dynk8s:images"] = map[string]any{"scripts": pinned, "pause": "registry.k8s.io/pause:3.10.1"}
	cfg, err := parse(t, c)
	assert.NilError(t, err)
	assert.Equal(t, cfg.Images.Scripts, pinned)
	assert.Equal(t, cfg.Images.Autoscaler, "", "unset: the default")

	for key, bad := range map[string]string{
		"autoscaler":         "mirror.example.com/ca@sha256:0123",
		"terminationHandler": "Mirror/NTH:v1",
		"pause":              "pause:3.10 1",
	} {
		c := devConfig(t)
		c["dynk8s:images"] = map[string]any{key: bad}
		refusedAt(t, c, "dynk8s:images."+key, "is not an image reference")
	}
	c = devConfig(t)
	c["dynk8s:images"] = map[string]any{"cleanup": pinned}
	refusedAt(t, c, "dynk8s:images.cleanup", "unknown key")
}
