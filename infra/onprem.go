package infra

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/pulumi/pulumi/sdk/v3/go/pulumi"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	nodeutil "k8s.io/component-helpers/node/util"

	"github.com/dynk8s/dynk8s/infra/config"
	"github.com/dynk8s/dynk8s/internal/kube"
)

// OnPremNodeState is what the on-prem cluster says of its Nodes labelled kube.LabelOnPrem: the names of the Ready
// ones and of the others, each sorted.
type OnPremNodeState struct {
	Ready, NotReady []string
}

// OnPremNodes reads the on-prem cluster's Nodes labelled kube.LabelOnPrem, with the cluster access cfg configures.
// ClusterOnPremNodes is the engine's; the mock engine's answers for a stand-in cluster.
type OnPremNodes func(ctx context.Context, cfg *config.Config) (OnPremNodeState, error)

// onPremReadTimeout bounds the one list request: an on-prem cluster that does not answer in that time is one the
// preview cannot ask.
const onPremReadTimeout = 30 * time.Second

// ClusterOnPremNodes lists the Nodes labelled kube.LabelOnPrem through the Kubernetes API with the configured
// kubeconfig (its contents, or a path to it, as the Kubernetes provider takes either), or the ambient one
// (KUBECONFIG, ~/.kube/config) when none is configured: the access the stack's Kubernetes provider uses. It reads
// Nodes only, and keeps the kubeconfig in memory.
func ClusterOnPremNodes(ctx context.Context, cfg *config.Config) (OnPremNodeState, error) {
	rc, err := restConfig(cfg.Kubernetes.Kubeconfig)
	if err != nil {
		return OnPremNodeState{}, err
	}
	rc.Timeout = onPremReadTimeout
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return OnPremNodeState{}, fmt.Errorf("kubernetes client: %w", err)
	}
	list, err := cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{LabelSelector: kube.LabelOnPrem})
	if err != nil {
		return OnPremNodeState{}, fmt.Errorf("listing the Nodes labelled %s: %w", kube.LabelOnPrem, err)
	}
	var s OnPremNodeState
	for _, n := range list.Items {
		if nodeReady(n) {
			s.Ready = append(s.Ready, n.Name)
		} else {
			s.NotReady = append(s.NotReady, n.Name)
		}
	}
	slices.Sort(s.Ready)
	slices.Sort(s.NotReady)
	return s, nil
}

// restConfig is the client config of a kubeconfig's contents or path, or of the ambient kubeconfig when nil.
func restConfig(kubeconfig *string) (*rest.Config, error) {
	if kubeconfig == nil {
		rc, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(clientcmd.NewDefaultClientConfigLoadingRules(),
			&clientcmd.ConfigOverrides{}).ClientConfig()
		if err != nil {
			return nil, fmt.Errorf("the ambient kubeconfig: %w", err)
		}
		return rc, nil
	}
	text := []byte(*kubeconfig)
	if !strings.Contains(*kubeconfig, "\n") {
		if b, err := os.ReadFile(*kubeconfig); err == nil {
			text = b
		}
	}
	rc, err := clientcmd.RESTConfigFromKubeConfig(text)
	if err != nil {
		// The error may quote the text; the kubeconfig is a secret.
		return nil, errors.New("the configured kubeconfig (" + config.Namespace + ":kubernetes.kubeconfig) is no " +
			"kubeconfig and names no readable file")
	}
	return rc, nil
}

// nodeReady reports whether the Node's Ready condition is True.
func nodeReady(n corev1.Node) bool {
	_, c := nodeutil.GetNodeCondition(&n.Status, corev1.NodeReady)
	return c != nil && c.Status == corev1.ConditionTrue
}

// onPremWorkloads are the parts that run only on the Nodes labelled kube.LabelOnPrem (infra/addons, onPremAffinity).
const onPremWorkloads = "the Cluster Autoscaler, the CSR approver, the join token rotator and the stale-node cleanup"

// checkOnPremNodes refuses a stack whose on-prem cluster has no Ready Node labelled kube.LabelOnPrem: the parts that
// hold the stack's AWS keys run only there, and without one no pool would ever scale up or join. A preview that
// cannot ask the cluster warns and goes on, as the cluster reads of caCertHashes do; an update that cannot ask fails.
func checkOnPremNodes(ctx *pulumi.Context, cfg *config.Config, nodes OnPremNodes) error {
	s, err := nodes(ctx.Context(), cfg)
	if err != nil {
		if ctx.DryRun() {
			return ctx.Log.Warn(fmt.Sprintf("could not ask the on-prem cluster which Nodes are labelled %s (%v); "+
				"`pulumi up` checks again and stops if none is Ready", kube.LabelOnPrem, err), nil)
		}
		return fmt.Errorf("asking the on-prem cluster which Nodes are labelled %s: %w", kube.LabelOnPrem, err)
	}
	if len(s.Ready) > 0 {
		return nil
	}
	msg := fmt.Sprintf("no Ready Node of the on-prem cluster is labelled %[1]s, and %[2]s run only on such "+
		"Nodes: label the on-prem nodes that may run them (kubectl label node NAME %[1]s=true; no kubelet can set "+
		"that label, so a pool node cannot take it)", kube.LabelOnPrem, onPremWorkloads)
	if len(s.NotReady) > 0 {
		msg += "; labelled but not Ready: " + strings.Join(s.NotReady, ", ")
	}
	return errors.New(msg)
}
