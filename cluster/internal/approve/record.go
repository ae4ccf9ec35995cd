package approve

import (
	"context"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dynk8s/dynk8s/cluster/internal/cloud"
)

// recordKeep is how long an approval stays in the record after its instance is no longer live: past the hour the
// controller manager keeps an approved CSR (kubernetes pkg/controller/certificates/cleaner/cleaner.go,
// approvedExpiration), and EC2 never reuses an instance id, so an entry of a gone instance guards nothing after it.
const recordKeep = 2 * time.Hour

// approval is one entry of the record: the uid of the CSR approved for an instance, and when.
type approval struct {
	UID  string
	Time time.Time
}

// parseApproval reads an entry's value, "<csr uid> <RFC3339 time>"; ok is false for anything else.
func parseApproval(v string) (approval, bool) {
	uid, at, found := strings.Cut(v, " ")
	if !found || uid == "" {
		return approval{}, false
	}
	t, err := time.Parse(time.RFC3339, at)
	if err != nil {
		return approval{}, false
	}
	return approval{UID: uid, Time: t}, true
}

func (a approval) String() string { return a.UID + " " + a.Time.UTC().Format(time.RFC3339) }

// approvals is the approval record ConfigMap as last read: data[<instance id>] = "<csr uid> <time>" for every
// instance a certificate was approved for. It outlives the approved CSRs (the cleaner deletes them after an hour)
// and the controller's restarts, so an instance gets one certificate in its life.
type approvals struct {
	cm *corev1.ConfigMap // nil: there is none yet
}

// readRecord reads the record live from the API server (never from a cache: it is read just before an approval).
func (c *Controller) readRecord(ctx context.Context) (approvals, error) {
	cm, err := c.client.CoreV1().ConfigMaps(c.cfg.Namespace).Get(ctx, c.cfg.RecordName, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return approvals{}, nil
	case err != nil:
		return approvals{}, fmt.Errorf("read the approval record %s/%s: %w", c.cfg.Namespace, c.cfg.RecordName, err)
	}
	return approvals{cm: cm}, nil
}

// of is the entry for node. A value that is not "<uid> <time>" still counts as an approval (of no CSR this loop
// can finish): the record fails closed.
func (r approvals) of(node string) (approval, bool) {
	if r.cm == nil {
		return approval{}, false
	}
	v, ok := r.cm.Data[node]
	if !ok {
		return approval{}, false
	}
	if a, ok := parseApproval(v); ok {
		return a, true
	}
	return approval{UID: v}, true
}

// writeRecord adds node's approval to the record, creating it or updating the version read (a conflict is an error:
// the judgement runs again on a fresh read), and drops the entries older than recordKeep of instances not in
// live, a snapshot started after the CSR being approved was created.
func (c *Controller) writeRecord(ctx context.Context, r approvals, node string, a approval,
	live map[string]cloud.Instance) error {
	now := c.clock.Now()
	if r.cm == nil {
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: c.cfg.Namespace, Name: c.cfg.RecordName},
			Data: map[string]string{node: a.String()}}
		if _, err := c.client.CoreV1().ConfigMaps(c.cfg.Namespace).Create(ctx, cm, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("create the approval record %s/%s: %w", c.cfg.Namespace, c.cfg.RecordName, err)
		}
		return nil
	}
	cm := r.cm.DeepCopy()
	if cm.Data == nil {
		cm.Data = map[string]string{}
	}
	for id, v := range cm.Data {
		old, ok := parseApproval(v)
		if _, isLive := live[id]; ok && !isLive && now.Sub(old.Time) > recordKeep {
			delete(cm.Data, id)
			c.log.Info("prune approval record", "node", id, "approved", v)
		}
	}
	cm.Data[node] = a.String()
	if _, err := c.client.CoreV1().ConfigMaps(c.cfg.Namespace).Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("update the approval record %s/%s (resourceVersion %s): %w", c.cfg.Namespace,
			c.cfg.RecordName, cm.ResourceVersion, err)
	}
	return nil
}
