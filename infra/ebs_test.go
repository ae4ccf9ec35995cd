package infra_test

import (
	"errors"
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/dynk8s/dynk8s/cmd/plan/mockcloud"
	"github.com/dynk8s/dynk8s/cmd/plan/plan"
	"github.com/dynk8s/dynk8s/infra/config"
)

// TestCustomerManagedEBSKey: a region whose default EBS key is customer-managed fails the preview on
// identity.customerManagedEbsKey, before anything is declared, since every group launch would fail without a grant
// to the Auto Scaling service-linked role (AWS N7, security L10); the operator who granted it says so with that key.
// The AWS managed default passes.
func TestCustomerManagedEBSKey(t *testing.T) {
	const cmk = "arn:aws:kms:eu-central-1:123456789012:key/1234abcd-12ab-34cd-56ef-1234567890ab"
	run := func(t *testing.T, granted bool) (*plan.Result, error) {
		t.Helper()
		c := devConfig(t)
		if granted {
			obj(c, "identity")["customerManagedEbsKey"] = true
		}
		cfg, err := mockcloud.ConfigFromMap(c)
		assert.NilError(t, err)
		cfg.EBSDefaultKey = cmk
		return plan.RunConfig("dev", cfg)
	}

	res, err := run(t, false)
	var cfgErr *config.Error
	assert.Assert(t, errors.As(err, &cfgErr), "got %v", err)
	assert.Equal(t, cfgErr.Errors[0].Path, "dynk8s:identity.customerManagedEbsKey")
	assert.Check(t, is.Contains(cfgErr.Errors[0].Msg, "customer-managed key "+cmk))
	assert.Equal(t, len(res.Cloud.Resources()), 0, "nothing declared")

	res, err = run(t, true)
	assert.NilError(t, err)
	assert.Check(t, res.Cloud.Find("aws:autoscaling/group:Group", "pool-builders-x86-asg") != nil)

	// The AWS managed default key: asked, and accepted.
	res = runStack(t, devConfig(t))
	var asked []string
	for _, call := range res.Cloud.Calls() {
		if call.Token == "aws:ebs/getDefaultKmsKey:getDefaultKmsKey" || call.Token == "aws:kms/getKey:getKey" {
			asked = append(asked, call.Token)
		}
	}
	assert.DeepEqual(t, asked, []string{"aws:ebs/getDefaultKmsKey:getDefaultKmsKey", "aws:kms/getKey:getKey"})
}
