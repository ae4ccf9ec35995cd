package infra_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"gotest.tools/v3/assert"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dynk8s/dynk8s/infra"
	"github.com/dynk8s/dynk8s/infra/config"
	"github.com/dynk8s/dynk8s/internal/kube"
)

// onPremNode is a Node labelled kube.LabelOnPrem whose Ready condition has status ready ("" for none yet).
func onPremNode(name string, ready corev1.ConditionStatus) corev1.Node {
	n := corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{kube.LabelOnPrem: "true"}}}
	if ready != "" {
		n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: ready}}
	}
	return n
}

// onPremAPIServer is an API server that serves nodes for every Node list, and records each list's label selector;
// it returns a kubeconfig for it.
func onPremAPIServer(t *testing.T, nodes ...corev1.Node) (kubeconfig string, selectors func() []string) {
	t.Helper()
	var mu sync.Mutex
	var seen []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/api/v1/nodes" {
			http.NotFound(w, r)
			return
		}
		mu.Lock()
		seen = append(seen, r.URL.Query().Get("labelSelector"))
		mu.Unlock()
		list := corev1.NodeList{TypeMeta: metav1.TypeMeta{Kind: "NodeList", APIVersion: "v1"}, Items: nodes}
		w.Header().Set("Content-Type", "application/json")
		assert.Check(t, json.NewEncoder(w).Encode(list))
	}))
	t.Cleanup(srv.Close)
	kubeconfig = "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: " + srv.URL +
		"\ncontexts:\n- name: c\n  context:\n    cluster: c\n    user: u\ncurrent-context: c\nusers:\n- name: u\n" +
		"  user:\n    token: t\n"
	return kubeconfig, func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), seen...)
	}
}

// TestClusterOnPremNodes: the engine's reader asks the API server for the Nodes labelled kube.LabelOnPrem only (the
// label selector in the request), tells Ready from not Ready, and takes the kubeconfig's contents or a path to it;
// a configured value that is neither is refused without quoting it.
func TestClusterOnPremNodes(t *testing.T) {
	kubeconfig, selectors := onPremAPIServer(t, onPremNode("worker-2", corev1.ConditionTrue),
		onPremNode("worker-1", corev1.ConditionTrue), onPremNode("worker-3", corev1.ConditionUnknown),
		onPremNode("new", ""))
	path := filepath.Join(t.TempDir(), "admin.conf")
	assert.NilError(t, os.WriteFile(path, []byte(kubeconfig), 0o600))
	for _, kc := range []string{kubeconfig, path} {
		cfg := &config.Config{}
		cfg.Kubernetes.Kubeconfig = &kc
		s, err := infra.ClusterOnPremNodes(context.Background(), cfg)
		assert.NilError(t, err)
		assert.DeepEqual(t, s, infra.OnPremNodeState{Ready: []string{"worker-1", "worker-2"},
			NotReady: []string{"new", "worker-3"}})
	}
	assert.DeepEqual(t, selectors(), []string{kube.LabelOnPrem, kube.LabelOnPrem})

	secret := "not a kubeconfig: s3cr3t"
	cfg := &config.Config{}
	cfg.Kubernetes.Kubeconfig = &secret
	_, err := infra.ClusterOnPremNodes(context.Background(), cfg)
	assert.ErrorContains(t, err, "dynk8s:kubernetes.kubeconfig) is no kubeconfig")
	assert.Assert(t, !strings.Contains(err.Error(), "s3cr3t"), err)
}
