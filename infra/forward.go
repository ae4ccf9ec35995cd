package infra

import (
	"github.com/dynk8s/dynk8s/cloudinit"
	"github.com/dynk8s/dynk8s/infra/config"
)

// kubeadmAPIServerPort is the port kubeadm's API servers bind by default (InitConfiguration
// localAPIEndpoint.bindPort): the in-cluster `kubernetes` Service's endpoints carry it, and the pool nodes' CNI and
// kube-proxy pods reach the API server through that Service, not through apiServerEndpoint.
const kubeadmAPIServerPort = 6443

// GatewayForward is the gateway's forward filter for cfg (wireguard.onPremForward): nil in mode all, which forwards
// everything; in mode cluster, the API server's ports, the on-prem name servers and the operator's allow list (the
// CNI's encapsulation is the renderer's to know).
func GatewayForward(cfg *config.Config) *cloudinit.GatewayForward {
	f := cfg.WireGuard.OnPremForward
	if f.Mode != config.ForwardCluster {
		return nil
	}
	out := &cloudinit.GatewayForward{
		APIServerPorts: []int{int(cfg.Kubernetes.APIServerEndpoint.Port), kubeadmAPIServerPort},
		DNSServers:     cfg.Network.OnPremDNS.Servers,
	}
	for _, a := range f.Allow {
		out.Allow = append(out.Allow, cloudinit.ForwardAllow{CIDR: a.CIDR, Protocol: a.Protocol, Ports: a.Ports})
	}
	return out
}
