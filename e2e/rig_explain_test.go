//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/autoscaling"
	"gotest.tools/v3/assert"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/dynk8s/dynk8s/cmd/explain/explain"
	"github.com/dynk8s/dynk8s/internal/kube"
)

// explainAgrees checks cmd/explain's verdict on a pod the real autoscaler has decided on: the pod as the API server
// holds it, the stack's own config, and raised the group the autoscaler raised ("" for none). explain must name the
// pool of that group as the one it would raise (alone, or among a tie the autoscaler broke at random), or none.
func explainAgrees(ctx context.Context, t *testing.T, c cluster, s stackAutoscaling, pod, raised string) {
	t.Helper()
	explainAgreesWhy(ctx, t, c, s, pod, raised, "")
}

// explainAgreesWhy is explainAgrees for a pod the autoscaler refused saying why (its NotTriggerScaleUp reason, such
// as "Insufficient cpu" or "untolerated taint"): explain must name the same reason for some pool.
func explainAgreesWhy(ctx context.Context, t *testing.T, c cluster, s stackAutoscaling, pod, raised, why string) {
	t.Helper()
	var p corev1.Pod
	assert.NilError(t, c.getJSON(ctx, &p, "pod", "-n", "default", pod))
	templates, err := explain.Templates(s.cfg, explain.CatalogShape)
	assert.NilError(t, err)
	// The DaemonSets the cluster runs (the stack's, in the burst test), as the autoscaler counts them on the
	// template nodes and explain -pending reads them.
	var sets appsv1.DaemonSetList
	assert.NilError(t, c.getJSON(ctx, &sets, "daemonsets", "--all-namespaces"))
	templates = explain.WithDaemonSets(templates, sets.Items)
	report := explain.Explain(s.cfg, templates, &p)
	if raised == "" {
		if len(report.Raise) > 0 {
			t.Errorf("the autoscaler raised nothing for %s, explain would raise %v:\n%s", pod, report.Raise, report)
		}
		keyword := strings.TrimPrefix(why, "Insufficient ")
		if !slices.ContainsFunc(report.Verdicts, func(v explain.Verdict) bool {
			return slices.ContainsFunc(v.Reasons, func(r string) bool { return strings.Contains(r, keyword) })
		}) {
			t.Errorf("the autoscaler refused %s for %q, explain names no such reason:\n%s", pod, why, report)
		}
		t.Logf("explain agrees with the autoscaler on %s (%s):\n%s", pod, why, report)
		return
	}
	pool := s.groups[raised].labels[kube.LabelPool]
	if !slices.Contains(report.Raise, pool) {
		t.Errorf("the autoscaler raised %s (pool %s) for %s, explain would raise %v:\n%s", raised, pool, pod,
			report.Raise, report)
	}
	if len(report.Raise) > 1 {
		t.Logf("explain leaves a tie %v, which the autoscaler broke for %s", report.Raise, pool)
	}
	t.Logf("explain agrees with the autoscaler on %s (DaemonSets counted: %v):\n%s", pod,
		templates[0].DaemonSetPods, report)
}

// explainSeesTheGroup runs explain's AWS view (-pending's second half) against moto, with the admin's key where an
// operator has theirs, and checks it finds the group of the stack's pool by its tags, at its desired capacity.
func explainSeesTheGroup(ctx context.Context, t *testing.T, a *awsEnv, s stackAutoscaling, group string, desired int) {
	t.Helper()
	pool := s.groups[group].labels[kube.LabelPool]
	client := autoscaling.New(autoscaling.Options{Region: a.region, BaseEndpoint: aws.String(a.url),
		Credentials: credentials.NewStaticCredentialsProvider(a.admin.Key, a.admin.Secret, "")})
	var out bytes.Buffer
	if err := explain.GroupsView(ctx, client, s.cfg, &out); err != nil {
		t.Fatalf("explain's AWS view: %v\n%s", err, out.String())
	}
	want := fmt.Sprintf("aws: pool %s: group %s, desired %d", pool, group, desired)
	if !strings.Contains(out.String(), want) {
		t.Errorf("explain's AWS view lacks %q:\n%s", want, out.String())
	}
	t.Logf("explain's AWS view:\n%s", out.String())
}
