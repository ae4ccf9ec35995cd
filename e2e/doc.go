// Package e2e holds the real-engine tests (build tag e2e): the in-cluster component run through the real Pulumi
// engine and the real Kubernetes provider onto a real kube-apiserver, the node agent's discovery checked by
// the real kubeadm, the real Cluster Autoscaler scaling the stack's Auto Scaling groups, replayed into moto, and the
// rendered WireGuard tunnel carrying traffic between network namespaces (TestTunnel*: root, wg-quick, wireguard-go
// and nft; no control plane).
//
// They need the tools that hack/tools.sh builds and the throwaway control plane that hack/start-kube.sh starts:
//
//	hack/tools.sh && hack/start-kube.sh go test -tags e2e -count=1 ./e2e/
//
// Without that control plane (DYNK8S_E2E_KUBECONFIG unset) the tests skip, unless DYNK8S_REQUIRE_TOOLS is set,
// in which case they fail: CI must never pass by quietly running nothing.
//
// Each test sits in a file named for what it proves; what the tests share sits in rig_*_test.go, one file per rig
// (the control plane, the engine, the dev stack, moto, the autoscaler, the node, the box, the tunnel, the VPC), each
// describing its rig in its comments.
package e2e
