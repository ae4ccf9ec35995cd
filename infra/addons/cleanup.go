package addons

import (
	_ "embed" // the cleanup script
)

const (
	cleanupName      = "dynk8s-stale-node-cleanup"
	cleanupCredsName = "dynk8s-stale-node-cleanup-aws-credentials"
	// defaultScriptImage is the stock image the controller's init container fetches the controller in (it needs
	// bash, curl with --aws-sigv4 and coreutils) and the controller runs in. alpine/k8s
	// (github.com/alpine-docker/k8s, its Dockerfile) is built for linux/amd64 and linux/arm64 with bash, curl, jq and
	// coreutils; registry.k8s.io's distroless images have no shell, and the Bitnami images left the free catalog in
	// 2025.
	defaultScriptImage = "docker.io/alpine/k8s:1.36.2"
)

// cleanupCredentials declares the Secret with the cleanup IAM user's key, which the controller asks EC2 with (the
// approval and the stale Node cleanup) and downloads itself with: ec2:DescribeInstances, and the controller's
// objects of the agent bucket.
func (b *builder) cleanupCredentials() (*awsCredentials, error) {
	return b.awsCredentials("cleanup-credentials", cleanupCredsName, cleanupName, b.args.CleanupAWSAccessKeyID,
		b.args.CleanupAWSSecretAccessKey)
}
