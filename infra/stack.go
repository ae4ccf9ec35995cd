package infra

import (
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"net/netip"

	"github.com/pulumi/pulumi-aws/sdk/v6/go/aws"
	"github.com/pulumi/pulumi-kubernetes/sdk/v4/go/kubernetes"
	corev1 "github.com/pulumi/pulumi-kubernetes/sdk/v4/go/kubernetes/core/v1"
	"github.com/pulumi/pulumi/sdk/v3/go/pulumi"
	"sigs.k8s.io/yaml"
)

// Stack is everything one dynk8s stack declares, wired together.
type Stack struct {
	Network  *Network
	Identity *Identity
	Gateway  *WireGuardGateway
	// Pools are in config order.
	Pools  []*NodePool
	Addons *ClusterAddons

	cfg *Config
}

// NewStack declares the whole stack from a validated config.
func NewStack(ctx *pulumi.Context, cfg *Config) (*Stack, error) {
	s := &Stack{cfg: cfg}

	zones, err := availabilityZones(ctx, cfg)
	if err != nil {
		return nil, err
	}
	wgSource := ""
	if cfg.WireGuard.OnPremEndpoint != "" {
		if host, _, err := net.SplitHostPort(cfg.WireGuard.OnPremEndpoint); err == nil {
			if addr, err := netip.ParseAddr(host); err == nil {
				wgSource = netip.PrefixFrom(addr, 32).String()
			}
		}
	}
	s.Network, err = NewNetwork(ctx, "network", &NetworkArgs{
		ClusterName:         cfg.ClusterName,
		VPCCIDR:             cfg.Network.VPCCIDR,
		Zones:               zones,
		OnPremCIDRs:         cfg.WireGuard.OnPremCIDRs,
		TunnelCIDR:          cfg.WireGuard.TunnelCIDR,
		ListenPort:          cfg.WireGuard.ListenPort,
		WireGuardSourceCIDR: wgSource,
	})
	if err != nil {
		return nil, err
	}

	s.Identity, err = NewIdentity(ctx, "identity", &IdentityArgs{
		ClusterName:            cfg.ClusterName,
		Region:                 cfg.Region,
		Identity:               cfg.Identity,
		BootstrapTokenRotation: cfg.Kubernetes.BootstrapTokenRotation,
	})
	if err != nil {
		return nil, err
	}

	s.Gateway, err = NewWireGuardGateway(ctx, "gateway", &WireGuardGatewayArgs{
		Config:              cfg,
		InterfaceID:         s.Network.GatewayInterfaceID,
		InstanceProfileName: s.Identity.GatewayInstanceProfileName,
	})
	if err != nil {
		return nil, err
	}

	k8s, err := kubernetesProvider(ctx, cfg)
	if err != nil {
		return nil, err
	}
	hashes, err := caCertHashes(ctx, cfg, k8s)
	if err != nil {
		return nil, err
	}
	for _, pool := range cfg.NodePools {
		np, err := NewNodePool(ctx, "pool-"+pool.Name, &NodePoolArgs{
			Config:             cfg,
			Pool:               pool,
			SubnetIDs:          s.Network.SubnetIDs,
			SecurityGroupID:    s.Network.NodeSecurityGroupID,
			InstanceProfileARN: s.Identity.NodeInstanceProfileARN,
			CACertHashes:       hashes,
			JoinTokenParameter: JoinTokenParameter(cfg.ClusterName),
		})
		if err != nil {
			return nil, err
		}
		s.Pools = append(s.Pools, np)
	}

	s.Addons, err = NewClusterAddons(ctx, "addons", AddonsArgs(cfg, s.Identity.AutoscalerAccessKeyID,
		s.Identity.AutoscalerSecretAccessKey, s.Identity.BootstrapTokenID, s.Identity.BootstrapTokenSecret),
		pulumi.Providers(k8s))
	if err != nil {
		return nil, err
	}
	return s, nil
}

// AddonsArgs are the in-cluster component's args for a config: the credentials come from Identity in the stack, and
// from fixed values in the real-engine tests, which run the component on its own.
func AddonsArgs(cfg *Config, awsKeyID, awsSecretKey, tokenID, tokenSecret pulumi.StringInput) *ClusterAddonsArgs {
	return &ClusterAddonsArgs{
		ClusterName:          cfg.ClusterName,
		Region:               cfg.Region,
		KubernetesVersion:    cfg.Kubernetes.Version,
		Autoscaler:           cfg.Autoscaler,
		Fuse:                 cfg.Fuse,
		Cleanup:              cfg.Cleanup,
		TerminationHandler:   cfg.TerminationHandler,
		Pools:                cfg.NodePools,
		AWSAccessKeyID:       awsKeyID,
		AWSSecretAccessKey:   awsSecretKey,
		BootstrapTokenID:     tokenID,
		BootstrapTokenSecret: tokenSecret,
	}
}

// Export is one stack output.
type Export struct {
	Name  string
	Value pulumi.Input
}

// Exports are the stack outputs, in a fixed order. The on-prem WireGuard config is secret; the rest is not.
func (s *Stack) Exports() []Export {
	groups := pulumi.StringMap{}
	for i, p := range s.Pools {
		groups[s.cfg.NodePools[i].Name] = p.GroupName
	}
	return []Export{
		{"autoscalerVersion", pulumi.String(s.cfg.Autoscaler.Version)},
		{"gatewayPublicIp", s.Gateway.PublicIP},
		{"gatewayPublicKey", s.Gateway.PublicKey},
		{"joinTokenParameter", s.Identity.JoinTokenParameter},
		{"nodePoolGroups", groups},
		{"onPremWireGuardConfig", s.Gateway.OnPremConfig},
		{"vpcId", s.Network.VPCID},
	}
}

// availabilityZones returns the configured zone names, or the first N available zones of the region. The names are
// needed as plain values: subnets are keyed by zone name.
func availabilityZones(ctx *pulumi.Context, cfg *Config) ([]string, error) {
	if len(cfg.Network.AvailabilityZones) > 0 {
		return cfg.Network.AvailabilityZones, nil
	}
	res, err := aws.GetAvailabilityZones(ctx, &aws.GetAvailabilityZonesArgs{State: pulumi.StringRef("available")})
	if err != nil {
		return nil, fmt.Errorf("availability zones of %s: %w", cfg.Region, err)
	}
	if len(res.Names) < cfg.Network.AvailabilityZoneCount {
		return nil, fmt.Errorf("%s:network.availabilityZones: %s has %d available zones, %d asked for",
			Namespace, cfg.Region, len(res.Names), cfg.Network.AvailabilityZoneCount)
	}
	return res.Names[:cfg.Network.AvailabilityZoneCount], nil
}

// kubernetesProvider is the explicit provider for the on-prem cluster: the configured kubeconfig (kept secret), or
// the ambient one when none is configured.
func kubernetesProvider(ctx *pulumi.Context, cfg *Config) (*kubernetes.Provider, error) {
	args := &kubernetes.ProviderArgs{}
	if cfg.Kubernetes.KubeconfigSet {
		args.Kubeconfig = pulumi.ToSecret(pulumi.String(cfg.Kubernetes.Kubeconfig)).(pulumi.StringOutput)
	}
	p, err := kubernetes.NewProvider(ctx, "onprem", args)
	if err != nil {
		return nil, fmt.Errorf("kubernetes provider: %w", err)
	}
	return p, nil
}

// caCertHashes is the configured CA hash, or the hash of the CA in the cluster's kube-public/cluster-info (the
// ConfigMap kubeadm init publishes for token discovery), read through the Kubernetes provider.
func caCertHashes(ctx *pulumi.Context, cfg *Config, k8s *kubernetes.Provider) (pulumi.StringArrayOutput, error) {
	if cfg.Kubernetes.CACertHash != "" {
		return pulumi.ToStringArray([]string{cfg.Kubernetes.CACertHash}).ToStringArrayOutput(), nil
	}
	info, err := corev1.GetConfigMap(ctx, "cluster-info", pulumi.ID("kube-public/cluster-info"), nil,
		pulumi.Provider(k8s))
	if err != nil {
		return pulumi.StringArrayOutput{}, fmt.Errorf("reading kube-public/cluster-info for the CA hash "+
			"(or set %s:kubernetes.caCertHash): %w", Namespace, err)
	}
	return info.Data.ApplyT(func(data map[string]string) ([]string, error) {
		h, err := CACertHashFromKubeconfig(data["kubeconfig"])
		if err != nil {
			return nil, fmt.Errorf("kube-public/cluster-info: %w (set %s:kubernetes.caCertHash)", err, Namespace)
		}
		return []string{h}, nil
	}).(pulumi.StringArrayOutput), nil
}

// CACertHashFromKubeconfig computes kubeadm's discovery hash ("sha256:" + hex SHA-256 of the CA certificate's
// DER SubjectPublicKeyInfo) of the first cluster's CA in a kubeconfig, as kubeadm's pubkeypin does.
func CACertHashFromKubeconfig(kubeconfig string) (string, error) {
	var kc struct {
		Clusters []struct {
			Cluster struct {
				CAData string `json:"certificate-authority-data"`
			} `json:"cluster"`
		} `json:"clusters"`
	}
	if err := yaml.Unmarshal([]byte(kubeconfig), &kc); err != nil {
		return "", fmt.Errorf("parse kubeconfig: %w", err)
	}
	if len(kc.Clusters) == 0 || kc.Clusters[0].Cluster.CAData == "" {
		return "", errors.New("kubeconfig has no certificate-authority-data")
	}
	pemBytes, err := base64.StdEncoding.DecodeString(kc.Clusters[0].Cluster.CAData)
	if err != nil {
		return "", fmt.Errorf("certificate-authority-data: %w", err)
	}
	block, _ := pem.Decode(pemBytes)
	if block == nil || block.Type != "CERTIFICATE" {
		return "", errors.New("certificate-authority-data holds no PEM certificate")
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return "", fmt.Errorf("CA certificate: %w", err)
	}
	sum := sha256.Sum256(cert.RawSubjectPublicKeyInfo)
	return "sha256:" + hex.EncodeToString(sum[:]), nil
}
