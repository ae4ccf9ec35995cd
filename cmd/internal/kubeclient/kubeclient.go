// Package kubeclient builds the clients of the commands that talk to a real cluster (explain -pending, timeline,
// status) from the operator's kubeconfig, read as kubectl reads it.
package kubeclient

import (
	"fmt"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// RESTConfig is the client configuration of the cluster of kubeconfig ("": $KUBECONFIG, else ~/.kube/config) in
// kubeContext ("": the current context). Its errors start "kubeconfig: ".
func RESTConfig(kubeconfig, kubeContext string) (*rest.Config, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = kubeconfig
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules,
		&clientcmd.ConfigOverrides{CurrentContext: kubeContext}).ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("kubeconfig: %w", err)
	}
	return cfg, nil
}

// New returns a client for the cluster of kubeconfig in kubeContext, as RESTConfig reads them. Its errors say which
// step failed: "kubeconfig: ..." or "client: ...".
func New(kubeconfig, kubeContext string) (*kubernetes.Clientset, error) {
	cfg, err := RESTConfig(kubeconfig, kubeContext)
	if err != nil {
		return nil, err
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("client: %w", err)
	}
	return client, nil
}
