package infra_test

import (
	"testing"

	"gotest.tools/v3/assert"

	"github.com/dynk8s/dynk8s/infra/config"
	"github.com/dynk8s/dynk8s/internal/mockcloud"
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
