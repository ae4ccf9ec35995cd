// Package systemfake holds the system package's fakes for the agent's table tests.
package systemfake

import (
	"bytes"
	"sync"
)

// SyncBuffer is a bytes.Buffer that goroutines may write at once (a logger's output while the boot's pre-pull
// and wake-up log beside it).
type SyncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *SyncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *SyncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
