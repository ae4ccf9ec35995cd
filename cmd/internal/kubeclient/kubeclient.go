// Package kubeclient builds the client of the commands that talk to a real cluster (explain -pending, timeline)
// from the operator's kubeconfig, read as kubectl reads it.
package kubeclient

import (
	"fmt"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

// New returns a client for the cluster of kubeconfig ("": $KUBECONFIG, else ~/.kube/config) in kubeContext ("":
// the current context). Its errors say which step failed: "kubeconfig: ..." or "client: ...".
func New(kubeconfig, kubeContext string) (*kubernetes.Clientset, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = kubeconfig
	rest, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules,
		&clientcmd.ConfigOverrides{CurrentContext: kubeContext}).ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("kubeconfig: %w", err)
	}
	client, err := kubernetes.NewForConfig(rest)
	if err != nil {
		return nil, fmt.Errorf("client: %w", err)
	}
	return client, nil
}
