package kube

import (
	"fmt"
	"regexp"
	"strconv"
	"time"
)

// Version is an exact release version, MAJOR.MINOR.PATCH: the form the Kubernetes packages and the Cluster
// Autoscaler's image tag (after its "v") use.
type Version struct{ Major, Minor, Patch int }

var versionRE = regexp.MustCompile(`^(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)$`)

// ParseVersion accepts exactly MAJOR.MINOR.PATCH in decimal without leading zeros: no "v", no wildcard, no
// pre-release suffix.
func ParseVersion(s string) (Version, error) {
	m := versionRE.FindStringSubmatch(s)
	if m == nil {
		return Version{}, fmt.Errorf("%q must be an exact version like 1.34.4 (no 'v', no wildcard)", s)
	}
	var v Version
	for i, p := range []*int{&v.Major, &v.Minor, &v.Patch} {
		n, err := strconv.Atoi(m[i+1])
		if err != nil {
			return Version{}, fmt.Errorf("%q: %w", s, err)
		}
		*p = n
	}
	return v, nil
}

func (v Version) String() string { return fmt.Sprintf("%d.%d.%d", v.Major, v.Minor, v.Patch) }

// IsZero reports whether v is unset.
func (v Version) IsZero() bool { return v == Version{} }

// Minor is what dynk8s needs to know of one Kubernetes minor release. A minor is supported when it has a row.
type Minor struct {
	// Minor is the 1.x minor.
	Minor int
	// Pause is the sandbox image tag kubeadm of this minor pins (PauseVersion in cmd/kubeadm/app/constants of
	// k8s.io/kubernetes); CRI-O is told to use it, so the node does not pull a second pause image.
	Pause string
	// CRIO is the CRI-O stable stream the nodes install (isv:/cri-o:/stable:/v<CRIO>); CRI-O follows the Kubernetes
	// minor.
	CRIO string
	// Autoscaler is the latest Cluster Autoscaler patch release of the minor known when the row was written, ""
	// when none is known yet (then autoscaler.version must name one). The autoscaler's minor must equal the control
	// plane's (kubernetes/autoscaler cluster-autoscaler/README.md, "Releases"); a newer patch is always fine.
	Autoscaler string
	// EndOfLife is the day the minor gets its last patch release (YYYY-MM-DD, "End Of Life Date" on
	// kubernetes.io/releases/1.<minor>), "" when not yet published.
	EndOfLife string
}

// EndOfLifeDate is EndOfLife as a date (UTC midnight), ok false when it is not known.
func (m Minor) EndOfLifeDate() (t time.Time, ok bool) {
	t, err := time.Parse(time.DateOnly, m.EndOfLife)
	return t, err == nil
}

// Minors are the supported Kubernetes minors, oldest first. The floor is 1.31: dynk8s writes kubeadm's v1beta4
// JoinConfiguration, which kubeadm reads from 1.31 on.
//
// Sources. Pause: PauseVersion read in the k8s.io/kubernetes module at v1.31.x, v1.34.4, v1.35.4, v1.36.1 and
// v1.37.2. Autoscaler: the cluster-autoscaler-1.3x.y tags of kubernetes/autoscaler (1.32.7 to 1.36.1 as of
// 2026-08-22, version.go bumps in PRs #10027, #10029, #10030); 1.31.5 is the last 1.31 release (PR #8637, merged
// 2025-10-08; the next patch round, issue #8856, covered 1.32-1.34 only). EndOfLife: the "End Of Life Date" of
// kubernetes.io/releases/1.3x, as those pages stood in 2026 (1.37's was not yet known here).
var Minors = []Minor{
	{Minor: 31, Pause: "3.10", CRIO: "1.31", Autoscaler: "1.31.5", EndOfLife: "2025-10-28"},
	{Minor: 32, Pause: "3.10", CRIO: "1.32", Autoscaler: "1.32.7", EndOfLife: "2026-02-28"},
	{Minor: 33, Pause: "3.10", CRIO: "1.33", Autoscaler: "1.33.6", EndOfLife: "2026-06-28"},
	{Minor: 34, Pause: "3.10.1", CRIO: "1.34", Autoscaler: "1.34.5", EndOfLife: "2026-10-27"},
	{Minor: 35, Pause: "3.10.1", CRIO: "1.35", Autoscaler: "1.35.2", EndOfLife: "2027-02-28"},
	{Minor: 36, Pause: "3.10.2", CRIO: "1.36", Autoscaler: "1.36.1", EndOfLife: "2027-06-28"},
	{Minor: 37, Pause: "3.10.2", CRIO: "1.37"},
}

// LookupMinor returns the row of v's minor, or an error that names the supported range.
func LookupMinor(v Version) (Minor, error) {
	for _, m := range Minors {
		if v.Major == 1 && v.Minor == m.Minor {
			return m, nil
		}
	}
	return Minor{}, fmt.Errorf("version %s is not supported (Kubernetes 1.%d to 1.%d: kubeadm's v1beta4 "+
		"JoinConfiguration, and a known pause image and CRI-O stream)", v, Minors[0].Minor, Minors[len(Minors)-1].Minor)
}

// AutoscalerVersion is the Cluster Autoscaler release to run against a control plane of version k8s: override when
// given (it must be of k8s's minor), else the minor's known latest patch. The errors are sentences about the
// autoscaler version; the caller adds the config key.
func AutoscalerVersion(k8s Version, override string) (Version, error) {
	m, err := LookupMinor(k8s)
	if err != nil {
		return Version{}, err
	}
	if override == "" {
		if m.Autoscaler == "" {
			return Version{}, fmt.Errorf("no Cluster Autoscaler release is known for Kubernetes 1.%d; set the "+
				"version explicitly to the latest cluster-autoscaler-1.%d.x release", m.Minor, m.Minor)
		}
		return ParseVersion(m.Autoscaler)
	}
	ca, err := ParseVersion(override)
	if err != nil {
		return Version{}, err
	}
	// The nodes may trail the control plane by up to three minors (the kubelet's version skew policy); the
	// autoscaler's minor is the control plane's, which the preview compares with kube-system/kubeadm-config.
	if ca.Major != k8s.Major || ca.Minor < k8s.Minor || ca.Minor > k8s.Minor+3 {
		return Version{}, fmt.Errorf("the Cluster Autoscaler version %s does not fit nodes of Kubernetes %s: the "+
			"autoscaler's minor must be the control plane's, which is the nodes' (1.%d) or up to three minors newer",
			ca, k8s, k8s.Minor)
	}
	return ca, nil
}
