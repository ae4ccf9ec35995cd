package config

import (
	"fmt"
	"net/netip"
	"strings"

	"gopkg.in/yaml.v3"
)

// ClusterConfiguration is what the stack reads of kubeadm's ClusterConfiguration, the ConfigMap
// kube-system/kubeadm-config's data key ClusterConfiguration that kubeadm init writes (kubeadm.k8s.io/v1beta3 and
// v1beta4 spell these fields alike).
type ClusterConfiguration struct {
	KubernetesVersion string `yaml:"kubernetesVersion"`
	Networking        struct {
		// PodSubnet and ServiceSubnet are comma-separated lists (one per family on a dual-stack cluster);
		// PodSubnet is empty on a cluster made without --pod-network-cidr (the CNI picks its own ranges then).
		PodSubnet     string `yaml:"podSubnet"`
		ServiceSubnet string `yaml:"serviceSubnet"`
	} `yaml:"networking"`
}

// ParseClusterConfiguration reads a ClusterConfiguration document.
func ParseClusterConfiguration(doc string) (ClusterConfiguration, error) {
	var cc ClusterConfiguration
	if err := yaml.Unmarshal([]byte(doc), &cc); err != nil {
		return ClusterConfiguration{}, fmt.Errorf("ClusterConfiguration: %w", err)
	}
	return cc, nil
}

// CheckClusterNetworking compares kubernetes.podCidr and kubernetes.serviceCidr with the ranges the cluster's
// kubeadm-config states: the overlap checks of the stack's own ranges are only as good as these. Each mismatch is a
// FieldError at the key that fixes it. A subnet the cluster does not state (no podSubnet) is not compared.
func (c *Config) CheckClusterNetworking(cc ClusterConfiguration) []FieldError {
	var errs []FieldError
	for _, f := range []struct {
		key, field, subnets string
		have                netip.Prefix
	}{
		{"kubernetes.podCidr", "networking.podSubnet", cc.Networking.PodSubnet, c.Kubernetes.PodCIDR},
		{"kubernetes.serviceCidr", "networking.serviceSubnet", cc.Networking.ServiceSubnet, c.Kubernetes.ServiceCIDR},
	} {
		if strings.TrimSpace(f.subnets) == "" {
			continue
		}
		var same []string
		found := false
		for _, s := range strings.Split(f.subnets, ",") {
			p, err := netip.ParsePrefix(strings.TrimSpace(s))
			if err != nil {
				errs = append(errs, FieldError{Path: Namespace + ":" + f.key, Msg: fmt.Sprintf(
					"kube-system/kubeadm-config: %s %q is not a CIDR: %v", f.field, f.subnets, err)})
				found = true
				break
			}
			if p.Addr().Is4() != f.have.Addr().Is4() {
				continue
			}
			same = append(same, p.Masked().String())
			found = found || p.Masked() == f.have.Masked()
		}
		if !found && len(same) > 0 {
			errs = append(errs, FieldError{Path: Namespace + ":" + f.key, Msg: fmt.Sprintf(
				"is %s, but the cluster's %s is %s (kube-system/kubeadm-config): set it to the cluster's, so that "+
					"the checks that the stack's ranges do not overlap it see the range the cluster uses",
				f.have, f.field, strings.Join(same, ","))})
		}
	}
	return errs
}
