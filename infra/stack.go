// Package infra is the stack: the AWS components (network, identity, WireGuard gateway, node pools) and the wiring
// of them with the configuration and the in-cluster component into one Pulumi program.
package infra

import (
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"time"

	"github.com/pulumi/pulumi-aws/sdk/v6/go/aws"
	"github.com/pulumi/pulumi-kubernetes/sdk/v4/go/kubernetes"
	"github.com/pulumi/pulumi/sdk/v3/go/pulumi"

	"github.com/dynk8s/dynk8s/cloudinit"
	"github.com/dynk8s/dynk8s/infra/addons"
	"github.com/dynk8s/dynk8s/infra/config"
	"github.com/dynk8s/dynk8s/internal/kube"
	"github.com/dynk8s/dynk8s/node/nodeconfig"
)

// Stack is everything one dynk8s stack declares, wired together.
type Stack struct {
	Network  *Network
	Identity *Identity
	Gateway  *WireGuardGateway
	// Agent is the bucket the instances download the node agent from.
	Agent *AgentBucket
	// Pools are in config order.
	Pools  []*NodePool
	Addons *addons.ClusterAddons

	cfg *config.Config
}

// LoadConfig reads the stack configuration once, applies defaults and validates it (config.Parse). keys are the
// names of every key the stack sets (EngineConfigKeys under the engine): one the program does not read is refused.
// On any problem it returns a *config.Error listing all of them, and the caller declares nothing.
func LoadConfig(ctx *pulumi.Context, keys []string) (*config.Config, error) {
	return config.Parse(keys, ctx.GetConfig)
}

// Program is the whole Pulumi program, run by Run under the engine and by the plan under the mock engine: load and
// validate the config (a bad config declares nothing), declare the stack, export its outputs. keys are the names of
// the stack's config keys (LoadConfig); agent finds the built node agent (BuiltAgent under the engine); nodes reads
// the on-prem cluster's labelled Nodes (ClusterOnPremNodes under the engine). It returns the exports for callers
// that record them.
func Program(ctx *pulumi.Context, keys []string, agent AgentFiles, nodes OnPremNodes) ([]Export, error) {
	cfg, err := LoadConfig(ctx, keys)
	if err != nil {
		return nil, err
	}
	for _, w := range cfg.Warnings(time.Now(), ctx.IsConfigSecret) {
		if err := ctx.Log.Warn(w, nil); err != nil {
			return nil, err
		}
	}
	stack, err := NewStack(ctx, cfg, agent, nodes)
	if err != nil {
		return nil, err
	}
	exports := stack.Exports()
	for _, e := range exports {
		ctx.Export(e.Name, e.Value)
	}
	return exports, nil
}

// NewStack declares the whole stack from a validated config, with the node agent that agent finds, once nodes says
// the on-prem cluster has a Ready Node for the on-prem-only parts (checkOnPremNodes).
func NewStack(ctx *pulumi.Context, cfg *config.Config, agent AgentFiles, nodes OnPremNodes) (*Stack, error) {
	s := &Stack{cfg: cfg}

	zones, err := availabilityZones(ctx, cfg)
	if err != nil {
		return nil, err
	}
	types, err := instanceTypes(ctx, cfg, zones)
	if err != nil {
		return nil, err
	}
	var poolArches []kube.Arch
	for _, pool := range cfg.NodePools {
		poolArches = append(poolArches, pool.Arch)
	}
	poolArches = slices.Compact(slices.Sorted(slices.Values(poolArches)))
	gatewayArch := types[cfg.Gateway.InstanceType].Arch
	// Every binary is found before anything is declared: an unbuilt agent declares nothing.
	binaries, err := stackBinaries(agent, append(slices.Clone(poolArches), gatewayArch))
	if err != nil {
		return nil, err
	}
	baked, err := checkImages(ctx, cfg)
	if err != nil {
		return nil, err
	}
	if err := checkEBSDefaultKey(ctx, cfg); err != nil {
		return nil, err
	}
	k8s, hashes, err := readOnPremCluster(ctx, cfg, nodes)
	if err != nil {
		return nil, err
	}
	var wgSource netip.Prefix
	if ep := cfg.WireGuard.OnPremEndpoint; ep != nil {
		if addr, ok := ep.Addr(); ok && addr.Is4() {
			wgSource = netip.PrefixFrom(addr, addr.BitLen())
		}
	}
	s.Network, err = NewNetwork(ctx, "network", &NetworkArgs{
		ClusterName:     cfg.ClusterName,
		VPCCIDR:         cfg.Network.VPCCIDR,
		Zones:           zones,
		OnPremCIDRs:     cfg.WireGuard.OnPremCIDRs,
		TunnelCIDR:      cfg.WireGuard.TunnelCIDR,
		ListenPort:      cfg.WireGuard.ListenPort,
		WireGuardSource: wgSource,
	})
	if err != nil {
		return nil, err
	}

	s.Identity, err = NewIdentity(ctx, "identity", &IdentityArgs{
		ClusterName:            cfg.ClusterName,
		Region:                 cfg.Region,
		AutoscalerKeyRotation:  cfg.Identity.AutoscalerKeyRotation,
		BootstrapTokenRotation: cfg.Kubernetes.BootstrapTokenRotation,
		ParameterKey:           cfg.Identity.ParameterKey,
		NodeCaches:             slices.ContainsFunc(cfg.NodePools, func(p config.NodePool) bool { return p.Cache != nil }),
	})
	if err != nil {
		return nil, err
	}

	readers := []AgentReader{
		{Name: "node", Role: s.Identity.NodeRoleName, Arches: poolArches},
		{Name: "gateway", Role: s.Identity.GatewayRoleName, Arches: []kube.Arch{gatewayArch}},
	}
	bake, err := bakeReader(ctx, cfg)
	if err != nil {
		return nil, err
	}
	if bake != nil {
		readers = append(readers, *bake)
	}

	s.Agent, err = NewAgentBucket(ctx, "agent", &AgentBucketArgs{
		ClusterName:   cfg.ClusterName,
		Binaries:      binaries,
		RetentionDays: cfg.Agent.RetentionDays,
		Readers:       readers,
		// The controller's init container downloads it with the cleanup user's key, the key it asks EC2 with.
		ControllerReader: s.Identity.CleanupUserName,
		Deployer:         s.Identity.DeployerARN,
	})
	if err != nil {
		return nil, err
	}

	gatewayIP, err := GatewayPrivateIP(cfg.Network.VPCCIDR, zones[0])
	if err != nil {
		return nil, fmt.Errorf("wireguard gateway: %w", err)
	}
	gatewayImage, err := FedoraImage(cfg.Fedora.Release, gatewayArch, cfg.Region)
	if err != nil {
		return nil, fmt.Errorf("wireguard gateway: image: %w", err)
	}
	s.Gateway, err = NewWireGuardGateway(ctx, "gateway", &WireGuardGatewayArgs{
		ClusterName:         cfg.ClusterName,
		Region:              cfg.Region,
		InstanceType:        cfg.Gateway.InstanceType,
		Image:               gatewayImage,
		WireGuard:           cfg.WireGuard,
		VPCCIDR:             cfg.Network.VPCCIDR,
		IdleStop:            cfg.Gateway.IdleStop,
		SubnetID:            s.Network.GatewaySubnetID,
		AddressReservation:  s.Network.GatewayAddress,
		SecurityGroupID:     s.Network.GatewaySecurityGroupID,
		PrivateIP:           gatewayIP.String(),
		RouteTableID:        s.Network.RouteTableID,
		RoutedCIDRs:         s.Network.OnPremCIDRs,
		Internet:            s.Network.Internet,
		InstanceProfileName: s.Identity.GatewayInstanceProfileName,
		GatewayRoleName:     s.Identity.GatewayRoleName,
		ParameterKeyARN:     s.Identity.ParameterKeyARN,
		NodeRoleName:        s.Identity.NodeRoleName,
		WakerUserName:       s.Identity.CleanupUserName,
		Forward:             GatewayForward(cfg),
		Agent:               s.Agent.Objects[gatewayArch],
		// The network declared these routes up to the layout where the gateway owns its interface.
		FormerRouteParent:     s.Network,
		FormerRouteParentName: "network",
	})
	if err != nil {
		return nil, err
	}

	// Nodes start the gateway at boot only when it stops itself.
	var gatewayID pulumi.StringInput
	if cfg.Gateway.IdleStop > 0 {
		gatewayID = s.Gateway.InstanceID
	}
	for _, pool := range cfg.NodePools {
		var image FedoraImageQuery
		var bakedImage *BakedImage
		switch {
		case pool.Baked():
			b := baked[pool.Name]
			bakedImage = &b
		case pool.AMIID == "":
			if image, err = FedoraImage(cfg.Fedora.Release, pool.Arch, cfg.Region); err != nil {
				return nil, fmt.Errorf("node pool %q: image: %w", pool.Name, err)
			}
		}
		node, render := NodeConfig(cfg, pool, nil, JoinTokenParameter(cfg.ClusterName))
		np, err := NewNodePool(ctx, "pool-"+pool.Name, &NodePoolArgs{
			ClusterName:        cfg.ClusterName,
			Pool:               pool,
			Image:              image,
			GroupTags:          cfg.GroupTags(pool, types[pool.InstanceTypes[0]]),
			Node:               node,
			Render:             render,
			CACertHashes:       hashes,
			GatewayInstanceID:  gatewayID,
			SubnetIDs:          s.Network.SubnetIDs,
			SecurityGroupID:    s.Network.NodeSecurityGroupID,
			InstanceProfileARN: s.Identity.NodeInstanceProfileARN,
			GatewayAddress:     s.Network.GatewayAddress,
			Agent:              s.Agent.Objects[pool.Arch],
			BakedImage:         bakedImage,
			WarmReplacer: &WarmReplacer{UserName: s.Identity.CleanupUserName, InstanceARNs: s.Identity.InstanceARNs,
				Region: cfg.Region},
		})
		if err != nil {
			return nil, err
		}
		s.Pools = append(s.Pools, np)
	}

	addonsArgs := AddonsArgs(cfg, Credentials{
		AutoscalerKeyID: s.Identity.AutoscalerAccessKeyID, AutoscalerSecret: s.Identity.AutoscalerSecretAccessKey,
		CleanupKeyID: s.Identity.CleanupAccessKeyID, CleanupSecret: s.Identity.CleanupSecretAccessKey,
		RotatorKeyID: s.Identity.TokenRotatorAccessKeyID, RotatorSecret: s.Identity.TokenRotatorSecretAccessKey,
	})
	addonsArgs.JoinTokenParameterResource = s.Identity.JoinTokenParameterResource
	addonsArgs.Controller = ControllerDelivery(s.Agent)
	addonsArgs.GroupNames = s.groupNames()
	addonsArgs.GatewayInstanceID = gatewayID
	s.Addons, err = addons.NewClusterAddons(ctx, "addons", addonsArgs, pulumi.Providers(k8s))
	if err != nil {
		return nil, err
	}
	return s, nil
}

// checkImages asks EC2 about the images the pools boot before anything is declared (checkPinnedImages,
// checkBakedImages), and reports the problems of both at once, the pinned images' first. It returns the baked pools'
// images by pool name.
func checkImages(ctx *pulumi.Context, cfg *config.Config) (map[string]BakedImage, error) {
	pinnedErr := checkPinnedImages(ctx, cfg)
	baked, bakedErr := checkBakedImages(ctx, cfg)
	var problems []config.FieldError
	for _, err := range []error{pinnedErr, bakedErr} {
		var cfgErr *config.Error
		switch {
		case errors.As(err, &cfgErr):
			problems = append(problems, cfgErr.Errors...)
		case err != nil:
			return nil, err
		}
	}
	if len(problems) > 0 {
		return nil, &config.Error{Errors: problems}
	}
	return baked, nil
}

// bakeReader declares, when a pool is baked, the role and instance profile cmd/bake launches the bake instances
// with (newBakeProfile), and returns it as a reader of the agent objects of the architectures it bakes, as the
// nodes read theirs; nil without a baked pool.
func bakeReader(ctx *pulumi.Context, cfg *config.Config) (*AgentReader, error) {
	var arches []kube.Arch
	for _, pool := range cfg.NodePools {
		if pool.Baked() {
			arches = append(arches, pool.Arch)
		}
	}
	if len(arches) == 0 {
		return nil, nil
	}
	profile, err := newBakeProfile(ctx, "bake", cfg.ClusterName)
	if err != nil {
		return nil, err
	}
	return &AgentReader{Name: "bake", Role: profile.RoleName,
		Arches: slices.Compact(slices.Sorted(slices.Values(arches)))}, nil
}

// stackBinaries are what the agent bucket serves: the node agent for the nodes' and the gateway's architectures
// (each role reads its own architectures' objects), the controller for both (it runs on an on-prem node of either).
func stackBinaries(agent AgentFiles, agentArches []kube.Arch) ([]AgentBinary, error) {
	var binaries []AgentBinary
	for _, arch := range slices.Compact(slices.Sorted(slices.Values(agentArches))) {
		b, err := agent(NodeAgent, arch)
		if err != nil {
			return nil, err
		}
		binaries = append(binaries, b)
	}
	for _, arch := range ControllerArches {
		b, err := agent(Controller, arch)
		if err != nil {
			return nil, err
		}
		binaries = append(binaries, b)
	}
	return binaries, nil
}

// NodeConfig builds a pool's node.json (nodeconfig.Node: what the agent reads at boot) from the config, as kops'
// NewConfig builds nodeup's, and what its user data holds beside it (cloudinit.NodeRender); cloudinit.Node
// completes node.json with what every node of the version runs and renders both. The e2e joins render through it
// too, so the agent they run gets exactly what a pool's launch template carries. With fuse on, nodes register with
// the fuse startup taint: until the plugin advertises the resource, the autoscaler counts the node as still starting
// instead of adding another for the pods that wait for it; and they pre-pull the plugin's image. A pool with a warm
// pool names its launch lifecycle hook, whose action the boot completes.
func NodeConfig(cfg *config.Config, pool config.NodePool, caHashes []string, tokenParameter string) (nodeconfig.Node,
	cloudinit.NodeRender) {
	taints := pool.Taints
	var images []string
	if cfg.Fuse.Enabled {
		taints = append(slices.Clone(taints), kube.FuseStartupTaint)
		// The plugin's DaemonSet lands on every pool node; its image is pulled while the node joins. (The config
		// was validated, so every pool arch has an image.)
		if img, err := addons.FuseImage(cfg.Fuse, pool.Arch); err == nil {
			images = append(images, img)
		}
	}
	images = append(images, pool.PrePullImages...)
	var metadataUIDs []int
	if cfg.TerminationHandler.Enabled {
		// The termination handler polls the metadata service from the host network, as its own user.
		metadataUIDs = []int{addons.TerminationHandlerUID}
	}
	node := nodeconfig.Node{
		ClusterName:        cfg.ClusterName,
		PoolName:           pool.Name,
		APIServerEndpoint:  cfg.Kubernetes.APIServerEndpoint,
		JoinTokenParameter: tokenParameter,
		LaunchHook:         LaunchHook(pool),
		PrePullImages:      images,
		Join:               nodeconfig.Join{CACertHashes: caHashes, Labels: pool.NodeLabels(), Taints: taints},
		Host: nodeconfig.Host{
			OnPremCIDRs: cfg.WireGuard.OnPremCIDRs,
			// The config keeps it in wireguard.MinMTU..MaxMTU.
			TunnelMTU:    uint16(cfg.WireGuard.MTU),
			MetadataUIDs: metadataUIDs,
		},
	}
	if c := pool.Cache; c != nil {
		node.Cache = &nodeconfig.Cache{SizeGiB: c.SizeGiB, VolumeType: "gp3", IOPS: c.IOPS, Throughput: c.Throughput,
			MountPath: c.MountPath, MaxVolumes: pool.CacheVolumes()}
	}
	return node, cloudinit.NodeRender{
		KubernetesVersion: cfg.Kubernetes.Version,
		PauseImage:        cfg.Images.Pause,
		DNS:               cloudinit.OnPremDNS{Servers: cfg.Network.OnPremDNS.Servers, Domains: cfg.Network.OnPremDNS.Domains},
	}
}

// Credentials are the keys of the on-prem IAM users the in-cluster component hands on: the autoscaler's, the
// stale-node cleanup's and the join token rotator's.
type Credentials struct {
	AutoscalerKeyID, AutoscalerSecret pulumi.StringInput
	CleanupKeyID, CleanupSecret       pulumi.StringInput
	RotatorKeyID, RotatorSecret       pulumi.StringInput
}

// AddonsArgs are the in-cluster component's args for a config: the credentials come from Identity in the stack, and
// from fixed values in the real-engine tests, which run the component on its own.
func AddonsArgs(cfg *config.Config, creds Credentials) *addons.ClusterAddonsArgs {
	return &addons.ClusterAddonsArgs{
		ClusterName:                 cfg.ClusterName,
		Region:                      cfg.Region,
		Autoscaler:                  cfg.Autoscaler,
		AutoscalerVersion:           cfg.Derived.AutoscalerVersion,
		Fuse:                        cfg.Fuse,
		Cleanup:                     cfg.Cleanup,
		TerminationHandler:          cfg.TerminationHandler,
		Pools:                       cfg.NodePools,
		OnPremNodes:                 cfg.Kubernetes.OnPremNodes,
		Images:                      cfg.Images,
		AWSAccessKeyID:              creds.AutoscalerKeyID,
		AWSSecretAccessKey:          creds.AutoscalerSecret,
		CleanupAWSAccessKeyID:       creds.CleanupKeyID,
		CleanupAWSSecretAccessKey:   creds.CleanupSecret,
		JoinTokenParameter:          JoinTokenParameter(cfg.ClusterName),
		BootstrapTokenTTL:           cfg.Kubernetes.BootstrapTokenTTL,
		BootstrapTokenRotation:      cfg.Kubernetes.BootstrapTokenRotation,
		TokenRotatorAccessKeyID:     creds.RotatorKeyID,
		TokenRotatorSecretAccessKey: creds.RotatorSecret,
	}
}

// ControllerDelivery is where the controller's init container fetches the controller: the agent bucket's
// controller objects, one per architecture.
func ControllerDelivery(b *AgentBucket) addons.ControllerDelivery {
	d := addons.ControllerDelivery{Bucket: b.BucketName}
	for _, arch := range slices.Sorted(maps.Keys(b.Controller)) {
		o := b.Controller[arch]
		d.Objects = append(d.Objects, addons.ControllerObject{Arch: arch, Key: o.Key, VersionID: o.VersionID,
			SHA256: o.SHA256})
	}
	return d
}

// Export is one stack output.
type Export struct {
	Name  string
	Value pulumi.Input
}

// Exports are the stack outputs, in a fixed order. The on-prem WireGuard config is secret; the rest is not. The
// gateway's instance id lets an operator start or stop it by hand (`aws ec2 start-instances`).
func (s *Stack) Exports() []Export {
	groups := s.groupNames()
	exports := []Export{
		{"autoscalerVersion", pulumi.String(s.cfg.Derived.AutoscalerVersion.String())},
		{"gatewayInstanceId", s.Gateway.InstanceID},
	}
	// Only an on-prem peer that dials in has a gateway address to dial; a dialling-out gateway's changes with every
	// start.
	if s.cfg.WireGuard.OnPremEndpoint == nil {
		exports = append(exports, Export{"gatewayPublicIp", s.Gateway.PublicIP})
	}
	return append(exports, []Export{
		{"gatewayPublicKey", s.Gateway.PublicKey},
		{"joinTokenParameter", s.Identity.JoinTokenParameter},
		{"nodePoolGroups", groups},
		{"onPremWireGuardConfig", s.Gateway.OnPremConfig},
		{"vpcId", s.Network.VPCID},
	}...)
}

// groupNames are the pools' Auto Scaling group names, by pool name.
func (s *Stack) groupNames() pulumi.StringMap {
	groups := pulumi.StringMap{}
	for _, p := range s.Pools {
		groups[p.Name] = p.GroupName
	}
	return groups
}

// availabilityZones returns the configured zone names, or the first N available zones of the region. The names are
// needed as plain values: subnets are keyed by zone name.
func availabilityZones(ctx *pulumi.Context, cfg *config.Config) ([]string, error) {
	z := cfg.Network.AvailabilityZones
	if len(z.Names) > 0 {
		return z.Names, nil
	}
	// Availability Zones proper: an opted-in Local or Wavelength Zone sorts before them by name, lacks most
	// instance types, and ends in a letter that would number its subnet like a real zone's.
	res, err := aws.GetAvailabilityZones(ctx, &aws.GetAvailabilityZonesArgs{
		State: pulumi.StringRef("available"),
		Filters: []aws.GetAvailabilityZonesFilter{
			{Name: "zone-type", Values: []string{"availability-zone"}},
			{Name: "opt-in-status", Values: []string{"opt-in-not-required"}},
		},
	})
	path := config.Namespace + ":network.availabilityZones"
	if err != nil {
		// Not a configuration problem (no config change fixes an unreachable EC2 or a missing provider plugin), so
		// not reported as one.
		return nil, fmt.Errorf("%s: asking EC2 for the available zones of %s: %w", path, cfg.Region, err)
	}
	if len(res.Names) < z.Count {
		return nil, clusterError(path, "%s has %d available zones, %d asked for", cfg.Region, len(res.Names), z.Count)
	}
	names := res.Names[:z.Count]
	for i, n := range names {
		if j := slices.IndexFunc(names, func(o string) bool { return o[len(o)-1] == n[len(n)-1] }); j < i {
			return nil, clusterError(path, "zones %s and %s would share a subnet slot; list the zones by name",
				names[j], n)
		}
	}
	return names, nil
}

// readOnPremCluster reads and checks what the stack needs of the on-prem cluster before anything is declared in AWS:
// its provider, the CA pins (caCertHashes) and a Ready Node for the on-prem-only parts (checkOnPremNodes).
func readOnPremCluster(ctx *pulumi.Context, cfg *config.Config, nodes OnPremNodes) (*kubernetes.Provider,
	pulumi.StringArrayOutput, error) {
	k8s, err := kubernetesProvider(ctx, cfg)
	if err != nil {
		return nil, pulumi.StringArrayOutput{}, err
	}
	hashes, err := caCertHashes(ctx, cfg, k8s)
	if err != nil {
		return nil, pulumi.StringArrayOutput{}, err
	}
	if err := checkOnPremNodes(ctx, cfg, nodes); err != nil {
		return nil, pulumi.StringArrayOutput{}, err
	}
	return k8s, hashes, nil
}

// kubernetesProvider is the explicit provider for the on-prem cluster: the configured kubeconfig (kept secret), or
// the ambient one when none is configured. The kubeconfig goes nowhere else but to ClusterOnPremNodes' one read.
func kubernetesProvider(ctx *pulumi.Context, cfg *config.Config) (*kubernetes.Provider, error) {
	args := &kubernetes.ProviderArgs{}
	if kc := cfg.Kubernetes.Kubeconfig; kc != nil {
		args.Kubeconfig = pulumi.ToSecret(pulumi.String(*kc)).(pulumi.StringOutput)
	}
	p, err := kubernetes.NewProvider(ctx, "onprem", args)
	if err != nil {
		return nil, fmt.Errorf("kubernetes provider: %w", err)
	}
	return p, nil
}
