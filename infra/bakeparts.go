package infra

// AgentBucketPrefix is the name prefix of a cluster's agent bucket (S3 appends a unique suffix): cmd/bake finds the
// bucket by it and by its cluster tag.
func AgentBucketPrefix(clusterName string) string { return agentBucketPrefix(clusterName) }
