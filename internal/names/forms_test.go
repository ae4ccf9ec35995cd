package names

import (
	"testing"

	"gotest.tools/v3/assert"
)

func TestForms(t *testing.T) {
	for _, c := range []struct {
		is   func(string) bool
		good []string
		bad  []string
	}{
		{IsInstanceID, []string{"i-0123abcd", "i-0123456789abcdef0"}, []string{"i-0123", "i-0123456789ABCDEF0", "x-0123abcd", " i-0123abcd"}},
		{IsRegion, []string{"eu-central-1", "us-gov-west-1", "us-isob-east-1", "cn-north-1"}, []string{"eu-central", "EU-central-1", "eu-central-1a"}},
		{IsBootstrapToken, []string{"abcdef.0123456789abcdef"}, []string{"abcdef.0123456789abcde", "ABCDEF.0123456789abcdef", "placeholder"}},
		// The last character before "=" carries two zero bits: "B" would set one, so wg(8) refuses it.
		{IsTemplateVersion, []string{"1", "12", "0"}, []string{"$Latest", "$Default", "", "-1", "1.0", " 1"}},
		{IsWireGuardKey, []string{"HIgo9xNzJMWLKASShiTqIybxZ0U3wGLiUeJ1PKf8ykw="}, []string{"HIgo9xNzJMWLKASShiTqIybxZ0U3wGLiUeJ1PKf8ykB=", "abc="}},
	} {
		for _, s := range c.good {
			assert.Check(t, c.is(s), s)
		}
		for _, s := range c.bad {
			assert.Check(t, !c.is(s), s)
		}
	}
}

func TestOlderTemplateVersion(t *testing.T) {
	for _, c := range []struct {
		v, current string
		older      bool
	}{
		{"3", "4", true},
		// By number, not by text: "9" < "10".
		{"9", "10", true},
		{"4", "4", false},
		{"5", "4", false},
		// Only numbers are compared.
		{"$Latest", "4", false},
		{"3", "$Default", false},
		{"", "4", false},
		{"-1", "4", false},
	} {
		assert.Check(t, OlderTemplateVersion(c.v, c.current) == c.older, "%q against %q", c.v, c.current)
	}
}
