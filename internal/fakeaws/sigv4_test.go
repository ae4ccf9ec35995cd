package fakeaws

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
)

var testSig = SigV4{Region: "eu-central-1", Credentials: aws.Credentials{AccessKeyID: "ASIAFAKEKEY01",
	SecretAccessKey: "fake/secret+key", SessionToken: "fake-session=="}}

// signed is a request as a server receives it, signed by Sign for service and then changed by tamper.
func signed(t *testing.T, service string, sig SigV4, tamper func(*http.Request)) *http.Request {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, "http://127.0.0.1:4566/some/path?versionId=a.b~c&x=1%202",
		bytes.NewReader([]byte("Action=Describe&Version=1")))
	assert.NilError(t, err)
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	assert.NilError(t, sig.Sign(req, service))
	if tamper != nil {
		tamper(req)
	}
	// What the server reads: the request line's URI and the Host header.
	in := httptest.NewRequest(req.Method, req.URL.RequestURI(), req.Body)
	in.Host, in.Header, in.ContentLength = req.URL.Host, req.Header, req.ContentLength
	return in
}

// A request Sign signs passes Check, and each thing AWS checks, changed, fails it with its reason; the body is left
// for the handler.
func TestSigV4(t *testing.T) {
	t.Parallel()
	in := signed(t, "autoscaling", testSig, nil)
	assert.NilError(t, testSig.Check(in, "autoscaling"))
	assert.NilError(t, in.ParseForm())
	assert.Check(t, is.Equal(in.PostForm.Get("Action"), "Describe"))
	assert.NilError(t, testSig.Check(signed(t, "s3", testSig, nil), "s3"))
	longTerm := SigV4{Region: testSig.Region, Credentials: aws.Credentials{AccessKeyID: "AKIAFAKE", SecretAccessKey: "s"}}
	assert.NilError(t, longTerm.Check(signed(t, "ssm", longTerm, nil), "ssm"))

	other := testSig
	other.Credentials.SecretAccessKey = "another secret"
	for name, tc := range map[string]struct {
		service string
		sig     SigV4
		tamper  func(*http.Request)
		want    string
	}{
		"unsigned":      {tamper: func(r *http.Request) { r.Header.Del("Authorization") }, want: "no SigV4 Authorization header"},
		"another key":   {sig: other, want: "the signature does not match"},
		"another scope": {service: "ec2", want: "credential scope"},
		"body changed":  {tamper: func(r *http.Request) { r.Body = io.NopCloser(strings.NewReader("Action=Delete")) }, want: "the signature does not match"},
		"query changed": {tamper: func(r *http.Request) { r.URL.RawQuery += "&y=2" }, want: "the signature does not match"},
		"no token":      {tamper: func(r *http.Request) { r.Header.Del("X-Amz-Security-Token") }, want: "the session token is not sent and signed"},
		"old":           {tamper: func(r *http.Request) { r.Header.Set("X-Amz-Date", time.Now().Add(-time.Hour).UTC().Format(amzDate)) }, want: "off the server's clock"},
		"signed header changed": {tamper: func(r *http.Request) { r.Header.Set("Content-Type", "text/plain") },
			want: "the signature does not match"},
	} {
		t.Run(name, func(t *testing.T) {
			sig := tc.sig
			if sig.Region == "" {
				sig = testSig
			}
			service := tc.service
			if service == "" {
				service = "autoscaling"
			}
			err := testSig.Check(signed(t, "autoscaling", sig, tc.tamper), service)
			assert.ErrorContains(t, err, tc.want)
		})
	}
}
