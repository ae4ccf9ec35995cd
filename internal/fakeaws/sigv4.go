package fakeaws

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"
)

// SigV4 is what a request is signed with: the caller's credentials and the region. Check verifies a request's
// Signature Version 4 signature as AWS does ("Create a signed AWS API request", IAM User Guide), by signing the same
// request again, with the headers the client says it signed, with the SDK's own signer; Sign signs a request of the
// test's own.
type SigV4 struct {
	Region      string
	Credentials aws.Credentials
}

// amzDate is X-Amz-Date's form: ISO 8601 basic, UTC.
const amzDate = "20060102T150405Z"

// maxSkew is how far a request's time stamp may be from the server's clock: S3 refuses one further off with
// RequestTimeTooSkewed (its answer says MaxAllowedSkewMilliseconds 900000).
const maxSkew = 15 * time.Minute

var authRE = regexp.MustCompile(`^AWS4-HMAC-SHA256 Credential=([^/,]+)/([^,]+), ?SignedHeaders=([a-z0-9;-]+), ?Signature=([0-9a-f]{64})$`)

// Check says why r is not signed for service with v's credentials and region, nil if it is. It reads r's body and
// leaves it for the handler to read again.
func (v SigV4) Check(r *http.Request, service string) error {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		return fmt.Errorf("reading the body: %w", err)
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	m := authRE.FindStringSubmatch(r.Header.Get("Authorization"))
	if m == nil {
		return fmt.Errorf("no SigV4 Authorization header: %q", r.Header.Get("Authorization"))
	}
	keyID, scope, signedList, signature := m[1], strings.Split(m[2], "/"), m[3], m[4]
	signed := strings.Split(signedList, ";")
	token := r.Header.Get("X-Amz-Security-Token")
	switch {
	case keyID != v.Credentials.AccessKeyID:
		return fmt.Errorf("signed with key %s, not %s", keyID, v.Credentials.AccessKeyID)
	case len(scope) != 4 || scope[1] != v.Region || scope[2] != service || scope[3] != "aws4_request":
		return fmt.Errorf("credential scope %s, not one for %s/%s", m[2], v.Region, service)
	case !slices.Contains(signed, "host") || !slices.Contains(signed, "x-amz-date"):
		return fmt.Errorf("the host and the date are not both signed: %s", signedList)
	case v.Credentials.SessionToken != "" && (token != v.Credentials.SessionToken || !slices.Contains(signed, "x-amz-security-token")):
		return fmt.Errorf("the session token is not sent and signed (sent %q, signed headers %s)", token, signedList)
	case v.Credentials.SessionToken == "" && token != "":
		return errors.New("a session token with a long-term key")
	}
	at, err := time.Parse(amzDate, r.Header.Get("X-Amz-Date"))
	if err != nil {
		return fmt.Errorf("X-Amz-Date %q", r.Header.Get("X-Amz-Date"))
	}
	if d := time.Since(at); d > maxSkew || d < -maxSkew {
		return fmt.Errorf("signed at %s, %s off the server's clock", at, d.Round(time.Second))
	}
	payload := sha256Hex(body)
	if h := r.Header.Get("X-Amz-Content-Sha256"); h != "" {
		if h != "UNSIGNED-PAYLOAD" && h != payload {
			return fmt.Errorf("X-Amz-Content-Sha256 %s is not the body's %s", h, payload)
		}
		payload = h
	}
	// The same request with only what the client signed, signed again.
	again := &http.Request{Method: r.Method, Host: r.Host, Header: http.Header{},
		URL: &url.URL{Scheme: "http", Host: r.Host, Path: r.URL.Path, RawPath: r.URL.RawPath, RawQuery: r.URL.RawQuery}}
	for _, h := range signed {
		switch h {
		case "host":
		case "content-length":
			again.ContentLength = r.ContentLength
		default:
			again.Header[http.CanonicalHeaderKey(h)] = r.Header.Values(h)
		}
	}
	if err := signer(service).SignHTTP(context.Background(), v.Credentials, again, payload, service, v.Region, at); err != nil {
		return err
	}
	want := authRE.FindStringSubmatch(again.Header.Get("Authorization"))
	switch {
	case want == nil:
		return fmt.Errorf("the SDK signs %q", again.Header.Get("Authorization"))
	case want[3] != signedList:
		return fmt.Errorf("signed headers %s, where AWS signs %s of them", signedList, want[3])
	case want[4] != signature:
		return errors.New("the signature does not match")
	}
	return nil
}

// Sign signs r for service now, as an AWS SDK does (with S3's payload hash header for s3).
func (v SigV4) Sign(r *http.Request, service string) error {
	var body []byte
	if r.Body != nil {
		var err error
		if body, err = io.ReadAll(r.Body); err != nil {
			return err
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
	}
	payload := sha256Hex(body)
	if service == "s3" {
		r.Header.Set("X-Amz-Content-Sha256", payload)
	}
	return signer(service).SignHTTP(context.Background(), v.Credentials, r, payload, service, v.Region, time.Now())
}

// signer is the SDK's: S3 alone signs its path as sent, the other services their path escaped again ("Create a
// canonical request").
func signer(service string) *v4.Signer {
	return v4.NewSigner(func(o *v4.SignerOptions) { o.DisableURIPathEscaping = service == "s3" })
}

func sha256Hex(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}
