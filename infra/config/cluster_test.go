package config

import (
	"net/netip"
	"testing"

	"gotest.tools/v3/assert"
)

// TestCheckClusterNetworking: the configured ranges must be the ones kubeadm-config states, per family; what the
// cluster does not state is not compared.
func TestCheckClusterNetworking(t *testing.T) {
	cfg := &Config{Kubernetes: Kubernetes{PodCIDR: netip.MustParsePrefix("10.244.0.0/16"),
		ServiceCIDR: netip.MustParsePrefix("10.96.0.0/12")}}
	for _, c := range []struct {
		name, doc string
		want      []string
	}{
		{"kubeadm's defaults", "networking:\n  podSubnet: 10.244.0.0/16\n  serviceSubnet: 10.96.0.0/12\n", nil},
		{"dual stack", "networking:\n  podSubnet: fd00:1::/56,10.244.0.0/16\n  serviceSubnet: 10.96.0.0/12,fd00:2::/112\n", nil},
		{"no pod subnet stated", "networking:\n  serviceSubnet: 10.96.0.0/12\n", nil},
		{"another pod subnet", "networking:\n  podSubnet: 192.168.0.0/16\n  serviceSubnet: 10.96.0.0/12\n",
			[]string{"dynk8s:kubernetes.podCidr: is 10.244.0.0/16, but the cluster's networking.podSubnet is " +
				"192.168.0.0/16 (kube-system/kubeadm-config): set it to the cluster's, so that the checks that the " +
				"stack's ranges do not overlap it see the range the cluster uses"}},
		{"only another family", "networking:\n  podSubnet: fd00:1::/56\n  serviceSubnet: 10.96.0.0/12\n", nil},
		{"a wider service range", "networking:\n  podSubnet: 10.244.0.0/16\n  serviceSubnet: 10.96.0.0/11\n",
			[]string{"dynk8s:kubernetes.serviceCidr: is 10.96.0.0/12, but the cluster's networking.serviceSubnet is " +
				"10.96.0.0/11 (kube-system/kubeadm-config): set it to the cluster's, so that the checks that the " +
				"stack's ranges do not overlap it see the range the cluster uses"}},
		{"not a CIDR", "networking:\n  podSubnet: 10.244.0.0\n",
			[]string{"dynk8s:kubernetes.podCidr: kube-system/kubeadm-config: networking.podSubnet \"10.244.0.0\" is " +
				"not a CIDR: netip.ParsePrefix(\"10.244.0.0\"): no '/'"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			cc, err := ParseClusterConfiguration("apiVersion: kubeadm.k8s.io/v1beta4\nkind: ClusterConfiguration\n" + c.doc)
			assert.NilError(t, err)
			var got []string
			for _, e := range cfg.CheckClusterNetworking(cc) {
				got = append(got, e.Error())
			}
			assert.DeepEqual(t, got, c.want)
		})
	}
}
