package fakeaws

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
)

// S3 is a stand-in for S3's GetObject as the bootstrap calls it: path-style, of an object's pinned version.
type S3 struct {
	server
	// objects are by "bucket/key?versionId".
	objects  map[string][]byte
	failures int
}

// NewS3 starts an S3 that takes requests signed with sig; it stops, and reports its problems, when t ends.
func NewS3(t testing.TB, sig SigV4) *S3 {
	t.Helper()
	s := &S3{objects: map[string][]byte{}}
	s.start(t, "S3", "s3", sig, func(w http.ResponseWriter, err error) {
		s3Error(w, http.StatusForbidden, "SignatureDoesNotMatch", err.Error())
	}, s.serve)
	return s
}

// PutObject stores body as version versionID of bucket's key.
func (s *S3) PutObject(bucket, key, versionID string, body []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.objects[bucket+"/"+key+"?"+versionID] = body
}

// Fail answers the next n GETs (every GET: n < 0) with 503 SlowDown, as S3 does when it throttles.
func (s *S3) Fail(n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.failures = n
}

func (s *S3) serve(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet {
		s.problemf("%s %s", r.Method, r.URL)
		s3Error(w, http.StatusMethodNotAllowed, "MethodNotAllowed", "")
		return
	}
	if s.failures != 0 {
		s.failures--
		s3Error(w, http.StatusServiceUnavailable, "SlowDown", "")
		return
	}
	body, found := s.objects[strings.TrimPrefix(r.URL.Path, "/")+"?"+r.URL.Query().Get("versionId")]
	if !found {
		s3Error(w, http.StatusNotFound, "NoSuchVersion", "")
		return
	}
	_, _ = w.Write(body)
}

// s3Error answers as S3 does: an Error document with the code and, when there is one, the message.
func s3Error(w http.ResponseWriter, status int, code, msg string) {
	w.Header().Set("Content-Type", "application/xml")
	w.WriteHeader(status)
	if msg != "" {
		msg = "<Message>" + xmlText(msg) + "</Message>"
	}
	_, _ = fmt.Fprintf(w, "<Error><Code>%s</Code>%s</Error>", code, msg)
}
