package infra_test

import (
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/dynk8s/dynk8s/cmd/plan/mockcloud"
	"github.com/dynk8s/dynk8s/cmd/plan/plan"
	"github.com/dynk8s/dynk8s/infra"
	"github.com/dynk8s/dynk8s/infra/config"
)

// TestParameterKey: identity.parameterKey decides who can decrypt the two SecureStrings.
// aws-managed declares no key and no KMS statement; create declares a key whose policy lets only the node role
// decrypt the join token, the gateway role its key, the rotator encrypt the token and the deploying principal (for
// Pulumi, an IAM user or a role by its IAM ARN) encrypt and decrypt both, each through SSM for that parameter; the
// account administers the key but neither uses it nor creates grants; the key encrypts both parameters and is billed.
// A key ARN encrypts both with it and grants exactly those uses in the roles' and the rotator's IAM policies. In every
// case the rotator writes with the parameter's key. A value that is none of these, or a key of another region, is a
// config error that declares nothing.
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
	token := "arn:aws:ssm:eu-central-1:" + mockcloud.Account + ":parameter/dynk8s/homelab/join-token"
	gwKey := "arn:aws:ssm:eu-central-1:" + mockcloud.Account + ":parameter/dynk8s/homelab/wireguard-gateway-key"

	t.Run("aws-managed", func(t *testing.T) {
		res := run(t, "")
		assert.Check(t, is.Len(res.Cloud.ByType("aws:kms/key:Key"), 0))
		assert.DeepEqual(t, params(res), map[string]any{"identity-join-token": nil, "gateway-key": nil})
		assert.DeepEqual(t, sids(policyOf(t, res, rolePolicy, nodeRead)), []string{"ReadOneParameter"})
		assert.DeepEqual(t, sids(policyOf(t, res, userPolicy, rotatorWrite)), []string{"WriteOneParameter"})
		assert.Equal(t, rotatorKey(t, res), "alias/aws/ssm", "the rotator names SSM's default key")
	})
	t.Run("create", func(t *testing.T) {
		res := run(t, config.ParameterKeyCreate)
		keys := res.Cloud.ByType("aws:kms/key:Key")
		assert.Assert(t, is.Len(keys, 1))
		in := mockcloud.PlainMap(keys[0].Inputs, false)
		assert.Check(t, is.Equal(in["enableKeyRotation"], true))
		doc := keyPolicy(t, &keys[0])
		acct := mockcloud.Account
		assert.DeepEqual(t, keyUses(doc), []string{
			"arn:aws:iam::" + acct + ":role/dynk8s/homelab-gateway kms:Decrypt " + gwKey,
			"arn:aws:iam::" + acct + ":role/dynk8s/homelab-node kms:Decrypt " + token,
			"arn:aws:iam::" + acct + ":user/dynk8s/homelab-join-token-rotator kms:Encrypt " + token,
			"arn:aws:iam::" + acct + ":user/operator kms:Decrypt " + token,
			"arn:aws:iam::" + acct + ":user/operator kms:Decrypt " + gwKey,
			"arn:aws:iam::" + acct + ":user/operator kms:Encrypt " + token,
			"arn:aws:iam::" + acct + ":user/operator kms:Encrypt " + gwKey,
		})
		// The account keeps administering the key, so KMS's policy lockout check passes and the owner can mend
		// the policy; it names no one else for that.
		for _, action := range []string{"kms:PutKeyPolicy", "kms:ScheduleKeyDeletion", "kms:EnableKeyRotation"} {
			var who []string
			for _, st := range matchingStatements(doc, "Allow", action, "*") {
				who = append(who, st.Principal["AWS"]...)
			}
			assert.DeepEqual(t, who, []string{"arn:aws:iam::" + acct + ":root"})
		}
		keyARN := keys[0].Outputs["arn"].StringValue()
		assert.DeepEqual(t, params(res), map[string]any{"identity-join-token": keyARN, "gateway-key": keyARN})
		assert.Equal(t, rotatorKey(t, res), keyARN, "the rotator writes with the stack's key")
		var billed int
		for _, item := range res.IdleBill().Items {
			if item.Kind == plan.BillKMSKey {
				billed += item.Quantity
			}
		}
		assert.Check(t, is.Equal(billed, 1), "the key is on the idle bill")
	})
	t.Run("create, deployed by a role session", func(t *testing.T) {
		c := devConfig(t)
		obj(c, "identity")["parameterKey"] = config.ParameterKeyCreate
		res := deployedBy(t, c, "arn:aws:sts::"+mockcloud.Account+":assumed-role/dynk8s-deploy/ci-1234", "/ci/")
		keys := res.Cloud.ByType("aws:kms/key:Key")
		assert.Assert(t, is.Len(keys, 1))
		var deployer []string
		for _, use := range keyUses(keyPolicy(t, &keys[0])) {
			if !strings.Contains(use, "/dynk8s/homelab-") {
				deployer = append(deployer, use)
			}
		}
		// The role, by its IAM ARN with its path: a key policy names no session.
		role := "arn:aws:iam::" + mockcloud.Account + ":role/ci/dynk8s-deploy"
		assert.DeepEqual(t, deployer, []string{role + " kms:Decrypt " + token, role + " kms:Decrypt " + gwKey,
			role + " kms:Encrypt " + token, role + " kms:Encrypt " + gwKey})
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
		assert.Equal(t, rotatorKey(t, res), arn, "the rotator writes with the operator's key")
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

// keyPolicy parses a KMS key's policy.
func keyPolicy(t *testing.T, key *mockcloud.Resource) infra.PolicyDocument {
	t.Helper()
	var doc infra.PolicyDocument
	assert.NilError(t, json.Unmarshal([]byte(mockcloud.PlainMap(key.Inputs, false)["policy"].(string)), &doc))
	return doc
}

// keyUses are, sorted, "<principal> <action> <parameter ARN>" for every action of a key policy that reads or makes
// ciphertext (or hands that power on: CreateGrant) and that some statement allows, whatever wildcard it is granted
// by. Each use must be through SSM for exactly one parameter; a grant only for AWS services
// (kms:GrantIsForAWSResource) counts as none.
func keyUses(doc infra.PolicyDocument) []string {
	var uses []string
	for _, action := range []string{"kms:Decrypt", "kms:Encrypt", "kms:ReEncryptFrom", "kms:ReEncryptTo",
		"kms:GenerateDataKey", "kms:GenerateDataKeyWithoutPlaintext", "kms:CreateGrant"} {
		for _, s := range matchingStatements(doc, "Allow", action, "*") {
			if action == "kms:CreateGrant" && s.Condition["Bool"]["kms:GrantIsForAWSResource"] == "true" {
				continue
			}
			parameter := s.Condition["StringEquals"]["kms:EncryptionContext:PARAMETER_ARN"]
			if s.Condition["StringEquals"]["kms:ViaService"] != "ssm.eu-central-1.amazonaws.com" || parameter == "" {
				parameter = "(not only through SSM for one parameter)"
			}
			for _, who := range s.Principal["AWS"] {
				uses = append(uses, who+" "+action+" "+parameter)
			}
		}
	}
	slices.Sort(uses)
	return uses
}

// rotatorKey is the KMS key the join token rotator's pods pass to PutParameter (KMS_KEY_ID).
func rotatorKey(t *testing.T, res *plan.Result) string {
	t.Helper()
	for _, a := range controllerArgs(t, res) {
		if v, ok := strings.CutPrefix(a.(string), "--token-kms-key="); ok {
			return v
		}
	}
	return ""
}
