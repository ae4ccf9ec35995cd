package infra

import (
	"fmt"
	"regexp"
	"strconv"
)

// Cluster Autoscaler minor versions track Kubernetes minor versions, and the rule upstream gives is "the latest CA
// patch release of the control plane's minor" (kubernetes/autoscaler cluster-autoscaler/README.md, "Releases").
// autoscalerLatestPatch is that patch per Kubernetes minor, as far as it was known when the table was last updated.
// A newer patch of the same minor is always fine: set autoscaler.version to it.
//
// Where each entry comes from:
//   - 1.36.1, 1.35.2, 1.34.5, 1.33.6, 1.32.7: tags cluster-autoscaler-1.3x.y in kubernetes/autoscaler as of
//     2026-08-22 (shared/reference/domain-facts.md 1.8; version.go bumps in kubernetes/autoscaler PRs #10027,
//     #10029, #10030 of 2026-07-22).
//   - 1.31.5: kubernetes/autoscaler PR #8637 "[release-1.31] prepare v1.31.5 release" (merged 2025-10-08); the
//     following patch round (issue #8856, 2025-11) covered 1.32-1.34 only, so 1.31 ended there. The image tag is
//     pinned by digest in edgelesssys/constellation internal/versions/versions.go.
//   - 1.30.6: the same Constellation file pins cluster-autoscaler:v1.30.6; PR #8632 "prepare v1.30.7" was closed
//     unmerged (2025-10), and 1.30 was out of the n-3 backport window after that.
//   - 1.23.1 .. 1.29.5: the image promotion manifest of registry.k8s.io, kubernetes/k8s.io
//     registry.k8s.io/images/k8s-staging-autoscaling/images.yaml (commit fe84f3f, mid-2025), whose last tags per
//     minor are v1.23.1, v1.24.3, v1.25.3, v1.26.8, v1.27.8, v1.28.7, v1.29.5; all these minors had left the
//     backport window by then.
var autoscalerLatestPatch = map[int]int{
	23: 1,
	24: 3,
	25: 3,
	26: 8,
	27: 8,
	28: 7,
	29: 5,
	30: 6,
	31: 5,
	32: 7,
	33: 6,
	34: 5,
	35: 2,
	36: 1,
}

// autoscalerFuseFixed is the first patch per minor that merges the ASG node-template resource tags into the template
// node. Before it, a pod requesting an extended resource (github.com/fuse) never triggers a scale-up from zero:
// kubernetes/autoscaler issue #5164, fixed on master by PR #5214 (first released in 1.27) and backported to 1.26.3
// (#5722), 1.25.2 (#5736) and 1.24.2 (#5737). The 1.23 backport (#5739) was closed unmerged, so 1.23 and older never
// got the fix.
var autoscalerFuseFixed = map[int]int{24: 2, 25: 2, 26: 3}

// autoscalerFirstFuseFixedMinor is the first minor whose every release has the fix.
const autoscalerFirstFuseFixedMinor = 27

var autoscalerVersionPattern = regexp.MustCompile(`^(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)$`)

// autoscalerSemver is a plain MAJOR.MINOR.PATCH release version.
type autoscalerSemver struct{ major, minor, patch int }

func (v autoscalerSemver) String() string { return fmt.Sprintf("%d.%d.%d", v.major, v.minor, v.patch) }

// parseAutoscalerSemver accepts exactly MAJOR.MINOR.PATCH in decimal without leading zeros, no "v" and no
// pre-release suffix: it is the form both the Kubernetes packages and the autoscaler image tag (after its "v") use.
func parseAutoscalerSemver(s string) (autoscalerSemver, error) {
	m := autoscalerVersionPattern.FindStringSubmatch(s)
	if m == nil {
		return autoscalerSemver{}, fmt.Errorf("%q is not a version of the form MAJOR.MINOR.PATCH such as \"1.34.5\"", s)
	}
	var v autoscalerSemver
	for i, p := range []*int{&v.major, &v.minor, &v.patch} {
		n, err := strconv.Atoi(m[i+1])
		if err != nil {
			return autoscalerSemver{}, fmt.Errorf("%q: %w", s, err)
		}
		*p = n
	}
	return v, nil
}

// ResolveAutoscalerVersion returns the Cluster Autoscaler version (e.g. "1.34.5", no "v") to run against a control
// plane of kubernetesVersion (e.g. "1.34.4"). With override empty it is the known latest patch of the Kubernetes
// minor; otherwise it is override itself, after checking it. The errors are plain sentences about the autoscaler
// version; the caller adds the config key.
//
// It refuses:
//   - a malformed override or Kubernetes version;
//   - an override of another minor than the Kubernetes one (CA's informers and scheduler code are built against one
//     Kubernetes minor);
//   - with fuseEnabled, a version that ignores node-template resource tags when scaling from zero (all of 1.23 and
//     older, 1.24.0-1.24.1, 1.25.0-1.25.1, 1.26.0-1.26.2), because then pods asking for github.com/fuse would never
//     make the autoscaler add a node;
//   - a Kubernetes minor without a known release and no override.
func ResolveAutoscalerVersion(kubernetesVersion, override string, fuseEnabled bool) (string, error) {
	k8s, err := parseAutoscalerSemver(kubernetesVersion)
	if err != nil {
		return "", fmt.Errorf("the Kubernetes version: %w", err)
	}
	if k8s.major != 1 {
		return "", fmt.Errorf("the Kubernetes version %s is not a 1.x release", k8s)
	}

	var ca autoscalerSemver
	if override == "" {
		patch, ok := autoscalerLatestPatch[k8s.minor]
		if !ok {
			lo, hi := autoscalerKnownMinors()
			return "", fmt.Errorf("no Cluster Autoscaler release is known for Kubernetes 1.%d (known: 1.%d to 1.%d); "+
				"set the version explicitly to the latest cluster-autoscaler-1.%d.x release", k8s.minor, lo, hi, k8s.minor)
		}
		ca = autoscalerSemver{major: 1, minor: k8s.minor, patch: patch}
	} else {
		ca, err = parseAutoscalerSemver(override)
		if err != nil {
			return "", err
		}
		if ca.major != k8s.major || ca.minor != k8s.minor {
			return "", fmt.Errorf("the Cluster Autoscaler version %s does not match Kubernetes %s: "+
				"the autoscaler's minor version must equal the control plane's (use a 1.%d.x release)",
				ca, k8s, k8s.minor)
		}
	}

	if fuseEnabled && !autoscalerHonoursResourceTags(ca) {
		return "", fmt.Errorf("the Cluster Autoscaler version %s ignores the node-template resource tags when "+
			"scaling up from zero (kubernetes/autoscaler#5164), so pods requesting github.com/fuse would never get "+
			"a node; use 1.24.2+, 1.25.2+, 1.26.3+ or any 1.27 and later release, or disable fuse", ca)
	}
	return ca.String(), nil
}

// autoscalerHonoursResourceTags reports whether v builds template nodes with the resources from the ASG's
// k8s.io/cluster-autoscaler/node-template/resources/* tags.
func autoscalerHonoursResourceTags(v autoscalerSemver) bool {
	if v.major != 1 {
		return v.major > 1
	}
	if v.minor >= autoscalerFirstFuseFixedMinor {
		return true
	}
	first, ok := autoscalerFuseFixed[v.minor]
	return ok && v.patch >= first
}

// autoscalerKnownMinors returns the lowest and highest Kubernetes minor of the release table.
func autoscalerKnownMinors() (lo, hi int) {
	first := true
	for m := range autoscalerLatestPatch {
		if first || m < lo {
			lo = m
		}
		if first || m > hi {
			hi = m
		}
		first = false
	}
	return lo, hi
}

// autoscalerImage is the upstream image reference of a Cluster Autoscaler version as ResolveAutoscalerVersion
// returns it.
func autoscalerImage(version string) string {
	return "registry.k8s.io/autoscaling/cluster-autoscaler:v" + version
}
