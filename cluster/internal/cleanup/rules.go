package cleanup

import (
	"fmt"
	"regexp"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// verdict is what the rules that need no EC2 say of a Node.
type verdict int

const (
	// skip: the Node is not the cleanup's to delete (no pool label, not an AWS instance, another region's, Ready, no
	// Ready condition yet, being deleted). Its next update brings it back.
	skip verdict = iota
	// wait: NotReady, but not for long enough yet; look again after judgement.wait.
	wait
	// ask: NotReady for long enough; EC2 decides, from the state of judgement.instance.
	ask
)

// judgement is the verdict on one Node and what it rests on.
type judgement struct {
	verdict verdict
	// reason says why, for the log line, and (ask) the Event before a delete.
	reason string
	// instance is the Node's instance id (ask).
	instance string
	// wait is how long until the Node comes due (wait).
	wait time.Duration
}

// awsProviderPrefix starts an AWS providerID, aws:///<zone>/<instance id>: the form every pool node's kubelet
// registers with (its --provider-id, node/nodeconfig), by which the Cluster Autoscaler maps Nodes to instances.
const awsProviderPrefix = "aws:///"

// instanceIDPattern is the form of an EC2 instance id: i- and 8 or 17 hexadecimal digits, written as the old
// script's "i- and hexadecimal" without the length, which EC2 may change.
var instanceIDPattern = regexp.MustCompile(`^i-[0-9a-f]+$`)

// judge applies the rules that need no EC2 to node at now (see the package comment). An error is a pool Node with an
// AWS providerID whose instance or NotReady time cannot be read: the rules cannot say it is gone, so it is kept.
func judge(cfg Config, node *corev1.Node, now time.Time) (judgement, error) {
	if _, ok := node.Labels[cfg.PoolLabel]; !ok {
		return judgement{verdict: skip, reason: "no " + cfg.PoolLabel + " label"}, nil
	}
	if node.DeletionTimestamp != nil {
		return judgement{verdict: skip, reason: "being deleted"}, nil
	}
	rest, ok := strings.CutPrefix(node.Spec.ProviderID, awsProviderPrefix)
	if !ok {
		return judgement{verdict: skip, reason: fmt.Sprintf("providerID %q is not an AWS one", node.Spec.ProviderID)}, nil
	}
	// Only Region's EC2 is asked, and it knows no other region's instance: the Node of another region's instance
	// (another stack's) would look gone.
	zone, instance, _ := strings.Cut(rest, "/")
	if !inRegion(zone, cfg.Region) {
		why := fmt.Sprintf("zone %s is not in %s, whose EC2 the cleanup asks", zone, cfg.Region)
		return judgement{verdict: skip, reason: why}, nil
	}
	ready := readyCondition(node)
	if ready == nil {
		return judgement{verdict: skip, reason: "no Ready condition yet"}, nil
	}
	switch ready.Status {
	case corev1.ConditionFalse, corev1.ConditionUnknown:
	case corev1.ConditionTrue:
		return judgement{verdict: skip, reason: "Ready"}, nil
	default:
		return judgement{verdict: skip, reason: fmt.Sprintf("Ready condition status %q", ready.Status)}, nil
	}
	if !instanceIDPattern.MatchString(instance) {
		return judgement{}, fmt.Errorf("providerID %q names no instance", node.Spec.ProviderID)
	}
	if ready.LastTransitionTime.IsZero() {
		return judgement{}, fmt.Errorf("its Ready condition (%s) has no lastTransitionTime", ready.Status)
	}
	age := now.Sub(ready.LastTransitionTime.Time)
	if age <= cfg.NotReadyAfter {
		// A second past the threshold, the resolution of the API's timestamps, the Node is due when it comes back.
		return judgement{
			verdict: wait,
			reason:  fmt.Sprintf("Ready=%s for %s, not more than %s", ready.Status, age.Round(time.Second), cfg.NotReadyAfter),
			wait:    cfg.NotReadyAfter - age + time.Second,
		}, nil
	}
	return judgement{
		verdict:  ask,
		reason:   fmt.Sprintf("Ready=%s for %s, more than %s", ready.Status, age.Round(time.Second), cfg.NotReadyAfter),
		instance: instance,
	}, nil
}

// inRegion says whether zone is one of region's: the region and a letter (eu-central-1a), or a Local or Wavelength
// Zone, the region, a dash and a name (eu-central-1-ham-1a); eu-central-10a is not eu-central-1's. The zone names
// are those of https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/using-regions-availability-zones.html.
func inRegion(zone, region string) bool {
	rest, ok := strings.CutPrefix(zone, region)
	switch {
	case !ok:
		return false
	case len(rest) == 1:
		return isLower(rest[0])
	default:
		return len(rest) >= 2 && rest[0] == '-' && isLower(rest[1])
	}
}

func isLower(b byte) bool { return 'a' <= b && b <= 'z' }

// readyCondition is node's Ready condition, nil when it has none (a Node that has just registered).
func readyCondition(node *corev1.Node) *corev1.NodeCondition {
	for i := range node.Status.Conditions {
		if node.Status.Conditions[i].Type == corev1.NodeReady {
			return &node.Status.Conditions[i]
		}
	}
	return nil
}
