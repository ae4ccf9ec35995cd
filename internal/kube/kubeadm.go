package kube

import (
	"fmt"
	"regexp"
)

var caCertHashRE = regexp.MustCompile(`^sha256:[0-9a-f]{64}$`)

// CheckCACertHash says why h is not a kubeadm discovery CA pin (sha256:<64 lowercase hex digits>, the SHA-256 of the
// CA certificate's SubjectPublicKeyInfo), or returns nil.
func CheckCACertHash(h string) error {
	if !caCertHashRE.MatchString(h) {
		return fmt.Errorf("must be sha256:<64 lowercase hex digits> (kubeadm's discovery hash of the CA's public "+
			"key), got %q", truncate(h, 80))
	}
	return nil
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}
