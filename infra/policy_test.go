package infra

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/dynk8s/dynk8s/internal/names"
)

// tagRequest is a CreateTags request as IAM sees it: who signed it (the source instance's ARN, "" for credentials
// used off the instance), what it tags, that instance's cluster tag, and the request's tag keys.
type tagRequest struct {
	source, target, cluster string
	keys                    []string
}

// allows evaluates st for r with the IAM semantics of the operators NodeKeyTagPolicy uses (IAM User Guide,
// "IAM JSON policy elements: Condition operators" and "Multivalued context key examples"); any other operator
// fails the test, so the evaluation never silently passes a condition it does not know.
func allows(t *testing.T, st PolicyStatement, r tagRequest) bool {
	t.Helper()
	if !slices.Contains(st.Action, "ec2:CreateTags") || !slices.ContainsFunc(st.Resource, func(p string) bool {
		return strings.HasSuffix(p, "/*") && strings.HasPrefix(r.target, strings.TrimSuffix(p, "*"))
	}) {
		return false
	}
	ctx := map[string]string{"aws:ARN": r.target, "aws:ResourceTag/" + names.TagCluster: r.cluster}
	vars := map[string]string{"${ec2:SourceInstanceARN}": r.source}
	for op, conds := range st.Condition {
		for key, want := range conds {
			if v, ok := vars[want]; ok {
				if v == "" {
					return false // a policy variable without a value matches nothing
				}
				want = v
			}
			switch op {
			case "StringEquals":
				if ctx[key] != want {
					return false
				}
			case "ForAllValues:StringEquals":
				assert.Assert(t, key == "aws:TagKeys", key)
				for _, k := range r.keys {
					if k != want {
						return false
					}
				}
			case "Null":
				assert.Assert(t, key == "aws:TagKeys" && want == "false", "%s %s", key, want)
				if len(r.keys) == 0 {
					return false
				}
			default:
				t.Fatalf("operator %s: not evaluated here", op)
			}
		}
	}
	return true
}

// The node role's tag statement, parsed back from its JSON: CreateTags only, on the region's instances of the
// account, and it allows exactly the node tagging its own instance of this cluster with the one key: not another
// instance, not credentials used off an instance, not another cluster's instance, not another key beside it, and
// not a request without tags.
func TestNodeKeyTagPolicy(t *testing.T) {
	t.Parallel()
	const arns = "arn:aws:ec2:eu-central-1:123456789012:instance/*"
	text, err := NodeKeyTagPolicy(arns, "homelab").JSON()
	assert.NilError(t, err)
	var doc PolicyDocument
	dec := json.NewDecoder(strings.NewReader(text))
	dec.DisallowUnknownFields()
	assert.NilError(t, dec.Decode(&doc))
	assert.Check(t, is.Equal(doc.Version, "2012-10-17"))
	assert.Assert(t, is.Len(doc.Statement, 1))
	st := doc.Statement[0]
	assert.Check(t, is.Equal(st.Effect, "Allow"))
	assert.Check(t, is.DeepEqual(st.Action, []string{"ec2:CreateTags"}))
	assert.Check(t, is.DeepEqual(st.Resource, []string{arns}))
	assert.Check(t, is.Contains(text, `"aws:ARN":"${ec2:SourceInstanceARN}"`), "the policy variable is written as is")

	self := "arn:aws:ec2:eu-central-1:123456789012:instance/i-0123456789abcdef0"
	other := "arn:aws:ec2:eu-central-1:123456789012:instance/i-0fedcba9876543210"
	for name, c := range map[string]struct {
		r    tagRequest
		want bool
	}{
		"its own instance, the one key": {r: tagRequest{self, self, "homelab", []string{names.TagKubeletKey}}, want: true},
		"another instance":              {r: tagRequest{self, other, "homelab", []string{names.TagKubeletKey}}},
		"credentials off the instance":  {r: tagRequest{"", self, "homelab", []string{names.TagKubeletKey}}},
		"another cluster's instance":    {r: tagRequest{self, self, "other", []string{names.TagKubeletKey}}},
		"an untagged instance":          {r: tagRequest{self, self, "", []string{names.TagKubeletKey}}},
		"another key beside it":         {r: tagRequest{self, self, "homelab", []string{names.TagKubeletKey, names.TagPool}}},
		"the cluster tag itself":        {r: tagRequest{self, self, "homelab", []string{names.TagCluster}}},
		"no tag keys":                   {r: tagRequest{self, self, "homelab", nil}},
		"another region": {r: tagRequest{strings.Replace(self, "eu-central-1", "us-east-1", 1),
			strings.Replace(self, "eu-central-1", "us-east-1", 1), "homelab", []string{names.TagKubeletKey}}},
	} {
		assert.Check(t, is.Equal(allows(t, st, c.r), c.want), name)
	}
}
