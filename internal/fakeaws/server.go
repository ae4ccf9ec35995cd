package fakeaws

import (
	"encoding/xml"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
)

// server is what every fake shares: a loopback server whose handler runs under one lock, the signature check of
// its service, and the problems it reports as errors of the test when the test ends.
type server struct {
	*httptest.Server
	name string

	mu       sync.Mutex
	requests int
	problems []string
	refusals []string
}

// start serves h on a new loopback server named name, checking each request's SigV4 signature for service with
// sig first, unless service is "" (IMDS signs nothing); refuse answers a request whose signature is off, in the
// service's own error format.
func (s *server) start(t testing.TB, name, service string, sig SigV4, refuse func(http.ResponseWriter, error),
	h http.HandlerFunc) {
	t.Helper()
	s.name = name
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		defer s.mu.Unlock()
		s.requests++
		if service != "" {
			if err := sig.Check(r, service); err != nil {
				s.refusals = append(s.refusals, fmt.Sprintf("%s %s: %v", r.Method, r.URL, err))
				refuse(w, err)
				return
			}
		}
		h(w, r)
	}))
	t.Cleanup(func() {
		s.Close()
		s.mu.Lock()
		defer s.mu.Unlock()
		for _, p := range s.problems {
			t.Errorf("fake %s: %s", s.name, p)
		}
		for _, r := range s.refusals {
			t.Errorf("fake %s refused a request for its signature: %s", s.name, r)
		}
	})
}

// Requests is how many requests the server has had, refused ones too.
func (s *server) Requests() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.requests
}

// Refusals returns why the server refused the requests it refused for their signature so far, and forgets them:
// those left when the test ends are its errors.
func (s *server) Refusals() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.refusals
	s.refusals = nil
	return r
}

// problemf records a request no client of dynk8s should make; it is reported when the test ends. The caller holds
// s.mu.
func (s *server) problemf(format string, args ...any) {
	s.problems = append(s.problems, fmt.Sprintf(format, args...))
}

// xmlText escapes s for an XML answer's text.
func xmlText(s string) string {
	var b strings.Builder
	_ = xml.EscapeText(&b, []byte(s))
	return b.String()
}
