// Package fakeaws holds wire-level fakes of what dynk8s' clients reach over the network, one per service: the
// instance metadata service (IMDS), the AWS APIs (SSM, Auto Scaling, EC2, S3), each verifying every request's
// SigV4 signature with the one checker (SigV4), and the cluster's API server as a joining node probes it. They are
// for tests that run the real clients (the node agent's built binary, the bootstrap with the real curl, the
// in-cluster scripts, the e2e's boxes) against loopback servers. Each is an httptest.Server with state the test sets
// and reads through its methods; what a real service would refuse it answers as that service does, and reports as
// an error of the test when the test ends.
package fakeaws
