package infra

import (
	"fmt"
	"time"
)

// Defaults of optional keys. Pulumi.yaml documents each of them; keep the two in step.
const (
	DefaultVPCCIDR               = "10.200.0.0/16"
	DefaultAvailabilityZoneCount = 2
	DefaultServiceCIDR           = "10.96.0.0/12" // kubeadm's default
	DefaultListenPort            = 51820
	DefaultTunnelCIDR            = "10.201.0.0/30"
	DefaultMTU                   = 1420 // 1500 minus WireGuard's 80 bytes of IPv6+UDP overhead
	DefaultGatewayInstanceType   = "t4g.micro"
	DefaultMaxSize               = 3
	DefaultVolumeSizeGiB         = 50
	DefaultScaleDownUnneeded     = "10m"
	DefaultExpander              = "least-waste"
	DefaultFuseCapacity          = 5000 // what the upstream fuse-device-plugin image advertises
	DefaultNotReadyAfter         = 10 * time.Minute
	DefaultRotation              = "1"
)

// parse reads every key into a Config with defaults. Type problems are recorded; semantics are validate's job.
func (p *parser) parse(get func(string) (string, bool)) *Config {
	cfg := &Config{}
	ns := Namespace + ":"

	if v, ok := p.topLevel(get, "aws:region", false); ok {
		cfg.Region = v.(string)
	}
	if v, ok := p.topLevel(get, ns+"clusterName", false); ok {
		cfg.ClusterName = v.(string)
	}

	read := func(key string) *object {
		v, _ := p.topLevel(get, ns+key, true)
		return p.object(ns+key, v)
	}

	k := read("kubernetes")
	cfg.Kubernetes = KubernetesConfig{
		Version:                k.str("version", ""),
		APIServerEndpoint:      k.str("apiServerEndpoint", ""),
		CACertHash:             k.str("caCertHash", ""),
		PodCIDR:                k.str("podCidr", ""),
		ServiceCIDR:            k.str("serviceCidr", DefaultServiceCIDR),
		KubeconfigSet:          k.has("kubeconfig"),
		Kubeconfig:             k.str("kubeconfig", ""),
		BootstrapTokenRotation: k.str("bootstrapTokenRotation", DefaultRotation),
	}
	k.done()

	n := read("network")
	cfg.Network.VPCCIDR = n.str("vpcCidr", DefaultVPCCIDR)
	cfg.Network.AvailabilityZoneCount = DefaultAvailabilityZoneCount
	if v, ok := n.get("availabilityZones"); ok {
		if _, isList := v.([]any); isList {
			cfg.Network.AvailabilityZones = n.strList("availabilityZones")
			cfg.Network.AvailabilityZoneCount = 0
		} else if c, err := toInt(v); err == nil {
			cfg.Network.AvailabilityZoneCount = c
		} else {
			p.addf(n.keyPath("availabilityZones"), "must be a zone count or a list of zone names, got %s", describe(v))
		}
	}
	n.done()

	w := read("wireguard")
	cfg.WireGuard = WireGuardConfig{
		ListenPort:      w.integer("listenPort", DefaultListenPort),
		OnPremCIDRs:     w.strList("onPremCidrs"),
		TunnelCIDR:      w.str("tunnelCidr", DefaultTunnelCIDR),
		MTU:             w.integer("mtu", DefaultMTU),
		OnPremPublicKey: w.str("onPremPublicKey", ""),
		OnPremEndpoint:  w.str("onPremEndpoint", ""),
	}
	w.done()

	g := read("gateway")
	cfg.Gateway.InstanceType = g.str("instanceType", DefaultGatewayInstanceType)
	g.done()

	f := read("fedora")
	cfg.Fedora.Release = f.integer("release", 0)
	f.done()

	if v, ok := p.topLevel(get, ns+"nodePools", true); ok {
		list, isList := v.([]any)
		if !isList {
			p.addf(ns+"nodePools", "must be a list of pools, got %s", describe(v))
		}
		for i, e := range list {
			cfg.NodePools = append(cfg.NodePools, p.nodePool(fmt.Sprintf("%snodePools[%d]", ns, i), e))
		}
	}

	a := read("autoscaler")
	cfg.Autoscaler = AutoscalerConfig{
		Version:               a.str("version", ""),
		ScaleDownUnneededTime: a.str("scaleDownUnneededTime", DefaultScaleDownUnneeded),
		Expander:              a.str("expander", DefaultExpander),
	}
	a.done()

	fu := read("fuse")
	cfg.Fuse = FuseConfig{
		Enabled:  fu.boolean("enabled", true),
		Capacity: fu.integer("capacity", DefaultFuseCapacity),
		Images:   fu.strMap("images"),
	}
	fu.done()

	id := read("identity")
	cfg.Identity = IdentityConfig{
		SessionManager:        id.boolean("sessionManager", false),
		ECRReadOnly:           id.boolean("ecrReadOnly", false),
		AutoscalerKeyRotation: id.str("autoscalerKeyRotation", DefaultRotation),
	}
	id.done()

	c := read("cleanup")
	cfg.Cleanup.NotReadyAfter = DefaultNotReadyAfter
	if s := c.str("notReadyAfter", ""); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil {
			p.addf(c.keyPath("notReadyAfter"), "must be a duration such as 10m, got %q", s)
		} else {
			cfg.Cleanup.NotReadyAfter = d
		}
	}
	c.done()

	t := read("terminationHandler")
	cfg.TerminationHandler.Enabled = t.boolean("enabled", true)
	t.done()

	return cfg
}

func (p *parser) nodePool(path string, v any) NodePoolConfig {
	o := p.object(path, v)
	pool := NodePoolConfig{
		Name:            o.str("name", ""),
		Arch:            o.str("arch", ""),
		InstanceTypes:   o.strList("instanceTypes"),
		MinSize:         o.integer("minSize", 0),
		MaxSize:         o.integer("maxSize", DefaultMaxSize),
		Spot:            o.boolean("spot", false),
		VolumeSizeGiB:   o.integer("volumeSizeGiB", DefaultVolumeSizeGiB),
		Labels:          o.strMap("labels"),
		AMIID:           o.str("amiId", ""),
		InstanceRefresh: o.boolean("instanceRefresh", false),
	}
	if list, ok := o.list("taints"); ok {
		for i, e := range list {
			t := p.object(fmt.Sprintf("%s.taints[%d]", path, i), e)
			pool.Taints = append(pool.Taints, Taint{
				Key:    t.str("key", ""),
				Value:  t.str("value", ""),
				Effect: t.str("effect", ""),
			})
			t.done()
		}
	}
	o.done()
	return pool
}
