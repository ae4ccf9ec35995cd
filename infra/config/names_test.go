package config_test

import (
	"errors"
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/dynk8s/dynk8s/infra/config"
)

// refusedAt asserts that the stack file c is refused with exactly one problem, at path, whose message contains msg.
func refusedAt(t *testing.T, c map[string]any, path, msg string) {
	t.Helper()
	cfg, err := parse(t, c)
	assert.Assert(t, cfg == nil, "a refused config yields no Config")
	var cfgErr *config.Error
	assert.Assert(t, errors.As(err, &cfgErr), "want a *config.Error, got %v", err)
	assert.Equal(t, len(cfgErr.Errors), 1, "want exactly one problem, got:\n%v", err)
	assert.Equal(t, cfgErr.Errors[0].Path, path)
	assert.Check(t, is.Contains(cfgErr.Errors[0].Msg, msg))
}

// TestPoolNameNotAStackName: a pool's instances are named <clusterName>-<pool>, so a pool may not take the name of
// one of the stack's own resources: its nodes would carry the gateway's Name tag.
func TestPoolNameNotAStackName(t *testing.T) {
	for _, name := range []string{"wireguard-gateway", "vpc", "node-sg", "subnet-eu-central-1a"} {
		c := devConfig(t)
		pool(c, 0)["name"] = name
		refusedAt(t, c, "dynk8s:nodePools[0].name", "the Name of one of the stack's own resources")
	}
	c := devConfig(t)
	pool(c, 0)["name"] = "gateway-builders"
	_, err := parse(t, c)
	assert.NilError(t, err, "a name that only starts like a stack name is fine")
}

// TestFractionalNumberIsNoText: YAML reads an unquoted 1.10 as the number 1.1, so a text key given a fractional
// number is refused rather than taken as "1.1": a rotation value changed from 1.1 to 1.10 would
// otherwise rotate nothing. Whole numbers stay text, as `pulumi config set --path` stores them.
func TestFractionalNumberIsNoText(t *testing.T) {
	c := devConfig(t)
	obj(c, "kubernetes")["bootstrapTokenRotation"] = 1.10
	refusedAt(t, c, "dynk8s:kubernetes.bootstrapTokenRotation", "quote it")

	c = devConfig(t)
	obj(c, "identity")["autoscalerKeyRotation"] = 2.5
	refusedAt(t, c, "dynk8s:identity.autoscalerKeyRotation", "quote it")

	c = devConfig(t)
	obj(c, "kubernetes")["bootstrapTokenRotation"] = float64(7)
	cfg, err := parse(t, c)
	assert.NilError(t, err)
	assert.Equal(t, cfg.Kubernetes.BootstrapTokenRotation, "7")
}
