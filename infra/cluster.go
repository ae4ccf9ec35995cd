package infra

import (
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"net/netip"
	"net/url"
	"strconv"
	"strings"

	"github.com/pulumi/pulumi-kubernetes/sdk/v4/go/kubernetes"
	corev1 "github.com/pulumi/pulumi-kubernetes/sdk/v4/go/kubernetes/core/v1"
	"github.com/pulumi/pulumi/sdk/v3/go/pulumi"
	"github.com/pulumi/pulumi/sdk/v3/go/pulumi/internals"
	"github.com/pulumi/pulumi/sdk/v3/go/pulumix"
	"sigs.k8s.io/yaml"

	"github.com/dynk8s/dynk8s/infra/config"
	"github.com/dynk8s/dynk8s/internal/kube"
)

// What the stack reads of the on-prem cluster at preview, and checks: the CA pin and the API server that kubeadm's
// discovery hands to joining nodes (kube-public/cluster-info), and the control plane's version
// (kube-system/kubeadm-config).

// caCertHashes is the configured CA hash, or the hash of the CA in the cluster's kube-public/cluster-info (the
// ConfigMap kubeadm init publishes for token discovery), read through the Kubernetes provider. Reading it also
// checks the server it names: kubeadm's discovery returns that server, and the joined kubelet talks to it, not to
// apiServerEndpoint, so it must be the same address, or a name the operator states resolves from the VPC.
//
// The stack waits for the reads and the checks here, before it declares anything else: a check that fails is then
// the program's own error, with its key path, and not the engine's "awaiting input property" failure of the first
// resource that would have taken the hashes (a launch template's user data). When a preview cannot know the
// ConfigMaps' data, the checks run at the update, still before the launch templates.
func caCertHashes(ctx *pulumi.Context, cfg *config.Config, k8s *kubernetes.Provider) (pulumi.StringArrayOutput, error) {
	info, err := corev1.GetConfigMap(ctx, "cluster-info", pulumi.ID("kube-public/cluster-info"), nil,
		pulumi.Provider(k8s))
	if err != nil {
		return pulumi.StringArrayOutput{}, fmt.Errorf("reading kube-public/cluster-info: %w", err)
	}
	kubeadmConfig, err := corev1.GetConfigMap(ctx, "kubeadm-config", pulumi.ID("kube-system/kubeadm-config"), nil,
		pulumi.Provider(k8s))
	if err != nil {
		return pulumi.StringArrayOutput{}, fmt.Errorf("reading kube-system/kubeadm-config: %w", err)
	}
	hashes := pulumix.Apply2Err(info.Data, kubeadmConfig.Data, func(data, kc map[string]string) ([]string, error) {
		return checkCluster(cfg, data["kubeconfig"], kc["ClusterConfiguration"])
	}).Untyped().(pulumi.StringArrayOutput)
	if _, err := internals.UnsafeAwaitOutput(ctx.Context(), hashes); err != nil {
		if cfgErr := (*config.Error)(nil); errors.As(err, &cfgErr) {
			return pulumi.StringArrayOutput{}, cfgErr
		}
		return pulumi.StringArrayOutput{}, clusterError(config.Namespace+":kubernetes.kubeconfig",
			"reading kube-public/cluster-info and kube-system/kubeadm-config from the on-prem cluster: %v", err)
	}
	return hashes, nil
}

// checkCluster checks what the stack read of the cluster against the config and returns the CA pins; a problem is a
// *config.Error at the key that would fix it.
func checkCluster(cfg *config.Config, clusterInfo, clusterConfiguration string) ([]string, error) {
	cc, err := config.ParseClusterConfiguration(clusterConfiguration)
	if err != nil {
		return nil, clusterError(config.Namespace+":kubernetes.version", "kube-system/kubeadm-config: %v", err)
	}
	cp, err := checkVersionSkew(cfg, cc)
	if err != nil {
		return nil, clusterError(config.Namespace+":kubernetes.version", "kube-system/kubeadm-config: %v", err)
	}
	if errs := cfg.CheckClusterNetworking(cc); len(errs) > 0 {
		return nil, &config.Error{Errors: errs}
	}
	// The autoscaler's minor must be the control plane's (kubernetes/autoscaler cluster-autoscaler/README.md,
	// "Releases"); its default follows the nodes' version, which may trail the control plane.
	if ca := cfg.Derived.AutoscalerVersion; ca.Major != cp.Major || ca.Minor != cp.Minor {
		return nil, clusterError(config.Namespace+":autoscaler.version", "kube-system/kubeadm-config: the control "+
			"plane is %s and the Cluster Autoscaler %s: the autoscaler's minor must be the control plane's; set "+
			"dynk8s:autoscaler.version to the latest cluster-autoscaler-1.%d.x release", cp, ca, cp.Minor)
	}
	if path, err := checkClusterInfoServer(cfg, clusterInfo); err != nil {
		return nil, clusterError(path, "kube-public/cluster-info: %v", err)
	}
	if h := cfg.Kubernetes.CACertHash; h != "" {
		return []string{h}, nil
	}
	h, err := CACertHashFromKubeconfig(clusterInfo)
	if err != nil {
		return nil, clusterError(config.Namespace+":kubernetes.caCertHash", "kube-public/cluster-info: %v (set the "+
			"CA pin yourself)", err)
	}
	return []string{h}, nil
}

func clusterError(path, format string, args ...any) *config.Error {
	return &config.Error{Errors: []config.FieldError{{Path: path, Msg: fmt.Sprintf(format, args...)}}}
}

// checkVersionSkew refuses nodes of a newer minor than the control plane, whose version kubeadm keeps in its
// ClusterConfiguration: the kubelet may be older than the API server, never newer (kubernetes.io version skew
// policy), and kubeadm refuses to join a cluster of an older minor.
// It returns the control plane's version.
func checkVersionSkew(cfg *config.Config, cc config.ClusterConfiguration) (kube.Version, error) {
	cp, err := kube.ParseVersion(strings.TrimPrefix(cc.KubernetesVersion, "v"))
	if err != nil {
		return kube.Version{}, fmt.Errorf("ClusterConfiguration.kubernetesVersion: %w", err)
	}
	if node := cfg.Kubernetes.Version; node.Major != cp.Major || node.Minor > cp.Minor {
		return kube.Version{}, fmt.Errorf("the nodes' version %s is newer than the control plane's %s: nodes may be "+
			"older than the API server by minors, never newer; upgrade the control plane first", node,
			cc.KubernetesVersion)
	}
	return cp, nil
}

// checkClusterInfoServer compares the server a cluster-info kubeconfig names with the configured endpoint. A
// problem comes with the key path that fixes it.
func checkClusterInfoServer(cfg *config.Config, kubeconfig string) (string, error) {
	endpointKey := config.Namespace + ":kubernetes.apiServerEndpoint"
	cluster, err := firstCluster(kubeconfig)
	if err != nil {
		return endpointKey, err
	}
	server := cluster.Server
	u, err := url.Parse(server)
	if err != nil || u.Host == "" {
		return endpointKey, fmt.Errorf("the server %q is not a URL", server)
	}
	port := u.Port()
	if port == "" {
		port = "443"
	}
	want := cfg.Kubernetes.APIServerEndpoint
	if _, err := netip.ParseAddr(u.Hostname()); err != nil {
		if cfg.Kubernetes.ServerNameResolvesInVpc {
			return "", nil
		}
		return config.Namespace + ":kubernetes.serverNameResolvesInVpc", fmt.Errorf("cluster-info names the API "+
			"server %s by name: joining nodes talk to it after discovery, and the VPC resolves only AWS names; make "+
			"the name resolve from the VPC to an address inside wireguard.onPremCidrs and set this key to true, or "+
			"have kubeadm publish the address (controlPlaneEndpoint)", server)
	}
	if u.Hostname() != want.Host || port != strconv.Itoa(int(want.Port)) {
		return endpointKey, fmt.Errorf("cluster-info names the API server %s, but %s is %s: kubeadm join "+
			"discovers through the one and then talks to the other; make them the same", server, endpointKey, want)
	}
	return "", nil
}

// kubeconfigCluster is the first cluster of a kubeconfig, as kubeadm's discovery reads cluster-info's.
type kubeconfigCluster struct {
	Server string `json:"server"`
	CAData string `json:"certificate-authority-data"`
}

func firstCluster(kubeconfig string) (kubeconfigCluster, error) {
	var kc struct {
		Clusters []struct {
			Cluster kubeconfigCluster `json:"cluster"`
		} `json:"clusters"`
	}
	if err := yaml.Unmarshal([]byte(kubeconfig), &kc); err != nil {
		return kubeconfigCluster{}, fmt.Errorf("parse kubeconfig: %w", err)
	}
	if len(kc.Clusters) == 0 {
		return kubeconfigCluster{}, errors.New("kubeconfig has no cluster")
	}
	return kc.Clusters[0].Cluster, nil
}

// CACertHashFromKubeconfig computes kubeadm's discovery hash ("sha256:" + hex SHA-256 of the CA certificate's
// DER SubjectPublicKeyInfo) of the first cluster's CA in a kubeconfig, as kubeadm's pubkeypin does.
func CACertHashFromKubeconfig(kubeconfig string) (string, error) {
	cluster, err := firstCluster(kubeconfig)
	if err != nil {
		return "", err
	}
	if cluster.CAData == "" {
		return "", errors.New("kubeconfig has no certificate-authority-data")
	}
	pemBytes, err := base64.StdEncoding.DecodeString(cluster.CAData)
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
