package infra_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/dynk8s/dynk8s/infra"
	"github.com/dynk8s/dynk8s/infra/config"
	"github.com/dynk8s/dynk8s/internal/mockcloud"
	"github.com/dynk8s/dynk8s/internal/plan"
)

// TestParameterKey: identity.parameterKey decides who can decrypt the two SecureStrings (security H3). aws-managed
// declares no key and no KMS statement; create declares a key whose policy lets only the node role decrypt the join
// token, the gateway role its key and the rotator encrypt the token, each through SSM for its own parameter (the
// account administers the key and, for Pulumi, writes both), encrypts both parameters with it and bills it; a key
// ARN encrypts both with it and grants exactly those uses in the roles' and the rotator's IAM policies. A value that
// is none of these, or a key of another region, is a config error that declares nothing.
func TestParameterKey(t *testing.T) {
	const arn = "arn:aws:kms:eu-central-1:123456789012:key/1234abcd-12ab-34cd-56ef-1234567890ab"
	run := func(t *testing.T, key string) *plan.Result {
		t.Helper()
		c := devConfig(t)
		if key != "" {
			obj(c, "identity")["parameterKey"] = key
		}
		return runStack(t, c)
	}
	params := func(res *plan.Result) map[string]any {
		out := map[string]any{}
		for _, p := range res.Cloud.ByType("aws:ssm/parameter:Parameter") {
			out[p.Name] = mockcloud.PlainMap(p.Inputs, false)["keyId"]
		}
		return out
	}
	policyOf := func(t *testing.T, res *plan.Result, typ, name string) infra.PolicyDocument {
		t.Helper()
		r := res.Cloud.Find(typ, name)
		assert.Assert(t, r != nil, "%s %s", typ, name)
		var doc infra.PolicyDocument
		assert.NilError(t, json.Unmarshal([]byte(mockcloud.PlainMap(r.Inputs, false)["policy"].(string)), &doc))
		return doc
	}
	sids := func(doc infra.PolicyDocument) (out []string) {
		for _, s := range doc.Statement {
			out = append(out, s.Sid)
		}
		return out
	}
	const nodeRead, gatewayRead, rotatorWrite = "identity-node-read-parameter", "identity-gateway-read-parameter",
		"identity-token-rotator"
	rolePolicy, userPolicy := "aws:iam/rolePolicy:RolePolicy", "aws:iam/userPolicy:UserPolicy"

	t.Run("aws-managed", func(t *testing.T) {
		res := run(t, "")
		assert.Check(t, is.Len(res.Cloud.ByType("aws:kms/key:Key"), 0))
		assert.DeepEqual(t, params(res), map[string]any{"identity-join-token": nil, "gateway-key": nil})
		assert.DeepEqual(t, sids(policyOf(t, res, rolePolicy, nodeRead)), []string{"ReadOneParameter"})
		assert.DeepEqual(t, sids(policyOf(t, res, userPolicy, rotatorWrite)), []string{"WriteOneParameter"})
	})
	t.Run("create", func(t *testing.T) {
		res := run(t, config.ParameterKeyCreate)
		keys := res.Cloud.ByType("aws:kms/key:Key")
		assert.Assert(t, is.Len(keys, 1))
		in := mockcloud.PlainMap(keys[0].Inputs, false)
		assert.Check(t, is.Equal(in["enableKeyRotation"], true))
		var doc infra.PolicyDocument
		assert.NilError(t, json.Unmarshal([]byte(in["policy"].(string)), &doc))
		acct := mockcloud.Account
		token := "arn:aws:ssm:eu-central-1:" + acct + ":parameter/dynk8s/homelab/join-token"
		gwKey := "arn:aws:ssm:eu-central-1:" + acct + ":parameter/dynk8s/homelab/wireguard-gateway-key"
		use := map[string]string{}
		for _, s := range doc.Statement {
			who := strings.Join(s.Principal["AWS"], ",")
			use[s.Sid] = who + " " + strings.Join(s.Action, ",") + " " +
				s.Condition["StringEquals"]["kms:EncryptionContext:PARAMETER_ARN"] + " " +
				s.Condition["StringEquals"]["kms:ViaService"]
			if s.Sid == "AdministerTheKey" {
				for _, a := range s.Action {
					assert.Check(t, a != "kms:Decrypt" && a != "kms:Encrypt" && a != "kms:*", "the account may %s", a)
				}
			}
		}
		via := " ssm.eu-central-1.amazonaws.com"
		root := "arn:aws:iam::" + acct + ":root"
		assert.Check(t, is.Equal(use["NodesReadTheJoinToken"], "arn:aws:iam::"+acct+":role/dynk8s/homelab-node kms:Decrypt "+token+via))
		assert.Check(t, is.Equal(use["TheGatewayReadsItsKey"], "arn:aws:iam::"+acct+":role/dynk8s/homelab-gateway kms:Decrypt "+gwKey+via))
		assert.Check(t, is.Equal(use["TheRotatorWritesTheJoinToken"], "arn:aws:iam::"+acct+":user/dynk8s/homelab-join-token-rotator kms:Encrypt "+token+via))
		assert.Check(t, is.Equal(use["PulumiWritesTheJoinToken"], root+" kms:Encrypt,kms:Decrypt "+token+via))
		assert.Check(t, is.Equal(use["PulumiWritesTheGatewayKey"], root+" kms:Encrypt,kms:Decrypt "+gwKey+via))
		assert.Check(t, is.Len(doc.Statement, 6))
		keyARN := keys[0].Outputs["arn"].StringValue()
		assert.DeepEqual(t, params(res), map[string]any{"identity-join-token": keyARN, "gateway-key": keyARN})
		var billed int
		for _, item := range res.IdleBill().Items {
			if item.Kind == plan.BillKMSKey {
				billed += item.Quantity
			}
		}
		assert.Check(t, is.Equal(billed, 1), "the key is on the idle bill")
	})
	t.Run("a key ARN", func(t *testing.T) {
		res := run(t, arn)
		assert.Check(t, is.Len(res.Cloud.ByType("aws:kms/key:Key"), 0))
		assert.DeepEqual(t, params(res), map[string]any{"identity-join-token": arn, "gateway-key": arn})
		for name, want := range map[string]string{nodeRead: "kms:Decrypt", gatewayRead: "kms:Decrypt"} {
			doc := policyOf(t, res, rolePolicy, name)
			assert.Assert(t, is.Len(doc.Statement, 2), name)
			assert.DeepEqual(t, doc.Statement[1].Action, []string{want})
			assert.DeepEqual(t, doc.Statement[1].Resource, []string{arn})
		}
		doc := policyOf(t, res, userPolicy, rotatorWrite)
		assert.Assert(t, is.Len(doc.Statement, 2))
		assert.DeepEqual(t, doc.Statement[1].Action, []string{"kms:Encrypt"})
	})
	for name, value := range map[string]string{
		"an alias":       "alias/aws/ssm",
		"another region": strings.Replace(arn, "eu-central-1", "us-east-1", 1),
	} {
		t.Run(name, func(t *testing.T) {
			c := devConfig(t)
			obj(c, "identity")["parameterKey"] = value
			cfg, err := mockcloud.ConfigFromMap(c)
			assert.NilError(t, err)
			res, err := plan.RunConfig("dev", cfg)
			var cfgErr *config.Error
			assert.Assert(t, errors.As(err, &cfgErr), "got %v", err)
			assert.Equal(t, cfgErr.Errors[0].Path, "dynk8s:identity.parameterKey")
			assert.Equal(t, len(res.Cloud.Resources()), 0, "nothing declared")
		})
	}
}
