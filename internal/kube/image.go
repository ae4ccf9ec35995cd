package kube

import (
	"fmt"

	"github.com/distribution/reference"
)

// NormalizeImage parses an image reference as the container runtimes do (github.com/distribution/reference, the
// parser containerd and CRI-O use) and returns it fully qualified, with ":latest" when it names no tag or digest:
// "busybox" is "docker.io/library/busybox:latest".
func NormalizeImage(ref string) (string, error) {
	named, err := reference.ParseNormalizedNamed(ref)
	if err != nil {
		return "", fmt.Errorf("%q is not an image reference: %w", ref, err)
	}
	return reference.TagNameOnly(named).String(), nil
}
