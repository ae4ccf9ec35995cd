package endpoint

import (
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
)

// host:port with an IP address (IPv6 in brackets) or a DNS name, and a port in 1..65535; anything else, a space
// included (it would split a unit's or a flag's value), is refused with the input named.
func TestParse(t *testing.T) {
	for in, want := range map[string]string{
		"192.168.10.10:6443":  "192.168.10.10:6443",
		"API.example.com:443": "API.example.com:443",
		"[fd00::10]:6443":     "[fd00::10]:6443",
	} {
		e, err := Parse(in)
		assert.NilError(t, err, in)
		assert.Check(t, is.Equal(e.String(), want))
	}
	for in, want := range map[string]string{
		"192.168.10.10":     "must be host:port",
		"api.example.com:0": "port must be 1..65535",
		"a:65536":           "port must be 1..65535",
		"a b:6443":          "host must be an IP address or a DNS name",
		"-a.example:6443":   "host must be an IP address or a DNS name",
	} {
		_, err := Parse(in)
		assert.Check(t, is.ErrorContains(err, want), in)
	}
	e, _ := Parse("192.168.10.10:6443")
	a, ok := e.Addr()
	assert.Check(t, ok && a.String() == "192.168.10.10")
	assert.Check(t, !e.IsZero() && HostPort{}.IsZero())
}
