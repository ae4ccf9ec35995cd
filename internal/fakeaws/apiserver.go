package fakeaws

import (
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
)

// APIServer is a stand-in for the cluster's API server as a joining node probes it before kubeadm join: GET
// /readyz over TLS, answered "ok" once the first drops connections have been dropped, as a control plane still
// starting (or a flaky path to it) does.
type APIServer struct {
	*httptest.Server
	mu    sync.Mutex
	drops int
}

// NewAPIServer starts an API server that drops the first drops connections; it stops when t ends.
func NewAPIServer(t testing.TB, drops int) *APIServer {
	t.Helper()
	s := &APIServer{drops: drops}
	s.Server = httptest.NewTLSServer(http.HandlerFunc(s.serve))
	t.Cleanup(s.Close)
	return s
}

func (s *APIServer) serve(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	drop := s.drops > 0
	s.drops--
	s.mu.Unlock()
	if drop {
		if conn, _, err := w.(http.Hijacker).Hijack(); err == nil {
			_ = conn.Close()
		}
		return
	}
	if r.Method != http.MethodGet || r.URL.Path != "/readyz" {
		http.NotFound(w, r)
		return
	}
	_, _ = io.WriteString(w, "ok")
}
