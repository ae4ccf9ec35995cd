package infra

import (
	"fmt"

	"github.com/pulumi/pulumi-aws/sdk/v6/go/aws/ebs"
	"github.com/pulumi/pulumi-aws/sdk/v6/go/aws/kms"
	"github.com/pulumi/pulumi/sdk/v3/go/pulumi"

	"github.com/dynk8s/dynk8s/infra/config"
)

// checkEBSDefaultKey refuses, before anything is declared, a region whose default EBS encryption key is
// customer-managed, unless identity.customerManagedEbsKey states that its policy lets the stack's launchers use it.
// Every volume the stack launches is encrypted with that default key (no key is named). The Auto Scaling
// service-linked role may use AWS managed keys only: with a customer-managed key and no grant in its policy, every
// launch of a group fails (EC2 Auto Scaling User Guide, "Required AWS KMS key policy for use with encrypted
// volumes"), and a node role without kms:CreateGrant on it cannot start the sleeping gateway. dynk8s does not grant
// them itself: a customer-managed key's policy is its owner's, often in another account or stack.
func checkEBSDefaultKey(ctx *pulumi.Context, cfg *config.Config) error {
	if cfg.Identity.CustomerManagedEBSKey {
		return nil
	}
	def, err := ebs.LookupDefaultKmsKey(ctx)
	if err != nil {
		return fmt.Errorf("asking EC2 for the default EBS encryption key of %s: %w", cfg.Region, err)
	}
	key, err := kms.LookupKey(ctx, &kms.LookupKeyArgs{KeyId: def.KeyArn})
	if err != nil {
		return fmt.Errorf("asking KMS about the default EBS encryption key %s of %s: %w", def.KeyArn, cfg.Region, err)
	}
	if key.KeyManager != "CUSTOMER" {
		return nil
	}
	return clusterError(config.Namespace+":identity.customerManagedEbsKey",
		"the default EBS encryption key of %s is the customer-managed key %s, which the Auto Scaling service-linked "+
			"role cannot use unless its key policy lets it (every launch would fail): grant it and the node role "+
			"as docs/security.md, \"Encrypted volumes\", shows, then set this key to true", cfg.Region, key.Arn)
}
