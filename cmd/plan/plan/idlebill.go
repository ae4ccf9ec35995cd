package plan

import (
	"fmt"
	"io"
	"math"
	"os"
	"strings"
	"text/tabwriter"

	"github.com/dynk8s/dynk8s/cloudinit"
	"github.com/dynk8s/dynk8s/cmd/plan/mockcloud"
	"github.com/dynk8s/dynk8s/infra"
	"github.com/dynk8s/dynk8s/internal/names"
	"github.com/dynk8s/dynk8s/node/nodeconfig"
)

// Kinds of billed items: what AWS charges for and by what unit.
const (
	// BillVolume is provisioned EBS storage, in GiB (billed per GiB-month while the volume exists, attached to a
	// stopped instance or not).
	BillVolume = "ebs-gib"
	// BillPublicIPv4 is a public IPv4 address, in addresses (billed per hour: an Elastic IP always, an address EC2
	// assigned at launch while its instance runs).
	BillPublicIPv4 = "public-ipv4"
	// BillAlarm is a CloudWatch alarm, in alarms (billed per alarm-month, whatever its state).
	BillAlarm = "cloudwatch-alarm"
	// BillInstance is a running EC2 instance, in instances (billed per hour of its type while it runs).
	BillInstance = "instance"
	// BillKMSKey is a customer-managed KMS key, in keys (billed per key-month while it exists).
	BillKMSKey = "kms-key"
	// BillS3Storage is S3 Standard storage, in MiB rounded up (billed per GB-month stored): the node agent's
	// objects.
	BillS3Storage = "s3-mib"
	// BillSnapshot is EBS snapshot storage (standard tier), in GiB (billed per GB-month of the blocks stored): the
	// baked images' snapshots.
	BillSnapshot = "ebs-snapshot-gib"
)

// IdleBill is what a stack bills, in quantities, while every pool is at zero nodes, and what running nodes add. It is
// read from the declared resources (not from the config), so it follows whatever the program declares;
// docs/costs.md prices the same kinds.
type IdleBill struct {
	// Region is the stack's region, which the prices are for.
	Region string `json:"region"`
	// Items bill while every pool is at zero (at its minimum, when that is not zero).
	Items []BillItem `json:"items"`
	// WhileNodesRun bill besides the nodes for every hour at least one node runs: a sleeping gateway's.
	WhileNodesRun []BillItem `json:"whileNodesRun"`
	// NodeHour is what one node of each pool adds per hour it runs.
	NodeHour []PoolHour `json:"nodeHour"`
	// MonthlyUSD is what Items cost a month at the region's list prices (Prices), and PriceNote the prices' date,
	// source and estimates; nil and empty for a region the plan has no prices for, or an item it cannot price.
	MonthlyUSD *float64 `json:"monthlyUsd,omitempty"`
	PriceNote  string   `json:"priceNote,omitempty"`
}

// BillItem is one billed quantity of a declared resource.
type BillItem struct {
	Kind     string `json:"kind"`
	Quantity int    `json:"quantity"`
	// Detail is the instance type of an instance, the volume type of a volume.
	Detail   string `json:"detail,omitempty"`
	Resource string `json:"resource"`
	Note     string `json:"note"`
	// USD is the item's price at the region's list prices: per month for the idle items, per hour for those that
	// bill while nodes run; nil when not priced.
	USD *float64 `json:"usd,omitempty"`
}

// PoolHour is what one node of a pool bills per hour.
type PoolHour struct {
	Pool string `json:"pool"`
	// InstanceTypes are the pool's types in the group's order of preference.
	InstanceTypes []string `json:"instanceTypes"`
	Spot          bool     `json:"spot"`
	VolumeGiB     int      `json:"volumeGiB"`
	PublicIPv4    int      `json:"publicIpv4"`
	// USDPerHour is one on-demand node's hour (its first type, volume and address) at the region's list prices;
	// nil for a spot pool, whose prices move, or a type the plan has no price for.
	USDPerHour *float64 `json:"usdPerHour,omitempty"`
}

// IdleBill reads the bill from the declared resources.
func (r *Result) IdleBill() IdleBill {
	bill := IdleBill{Region: r.Cloud.Region}
	resources := r.Resources()
	inputs := map[string]map[string]any{}
	for _, res := range resources {
		if !res.Read {
			inputs[res.Type+"/"+res.Name] = mockcloud.PlainMap(res.Inputs, false)
		}
	}
	byType := func(typ string) []mockcloud.Resource {
		var out []mockcloud.Resource
		for _, res := range resources {
			if res.Type == typ && !res.Read {
				out = append(out, res)
			}
		}
		return out
	}
	mapsPublicIP := map[string]bool{}
	for _, s := range byType("aws:ec2/subnet:Subnet") {
		mapsPublicIP[s.ID] = inputs[s.Type+"/"+s.Name]["mapPublicIpOnLaunch"] == true
	}
	eipOn := map[string]bool{}
	for _, e := range byType("aws:ec2/eip:Eip") {
		in := inputs[e.Type+"/"+e.Name]
		bill.Items = append(bill.Items, BillItem{Kind: BillPublicIPv4, Quantity: 1, Resource: e.Name,
			Note: "Elastic IP: bills whether its instance runs or not"})
		if nic, ok := in["networkInterface"].(string); ok {
			eipOn[nic] = true
		}
	}

	// A pool instance that never goes (a group's minimum, or a warm pool that waits Running) keeps a gateway that
	// would sleep awake: its idle check counts every pending or running pool instance (the node agent's gateway-idle).
	keptAwake := ""
	for _, g := range byType("aws:autoscaling/group:Group") {
		in := inputs[g.Type+"/"+g.Name]
		warm, _ := in["warmPool"].(map[string]any)
		if minSize, _ := in["minSize"].(float64); minSize > 0 {
			keptAwake = fmt.Sprintf("never stops: %s keeps %g instance(s) running (minSize)", g.Name, minSize)
			break
		}
		if warm != nil && warm["poolState"] == "Running" {
			keptAwake = "never stops: " + g.Name + "'s warm pool waits Running"
			break
		}
	}

	for _, inst := range byType("aws:ec2/instance:Instance") {
		in := inputs[inst.Type+"/"+inst.Name]
		root, _ := in["rootBlockDevice"].(map[string]any)
		gib, _ := root["volumeSize"].(float64)
		volumeType, _ := root["volumeType"].(string)
		bill.Items = append(bill.Items, BillItem{Kind: BillVolume, Quantity: int(gib), Detail: volumeType,
			Resource: inst.Name, Note: "root volume: bills while the instance is stopped too"})
		running := []BillItem{{Kind: BillInstance, Quantity: 1, Detail: str(in["instanceType"]), Resource: inst.Name}}
		subnet, _ := in["subnetId"].(string)
		nic := ""
		if v := inst.Outputs["primaryNetworkInterfaceId"]; v.IsString() {
			nic = v.StringValue()
		}
		if mapsPublicIP[subnet] && !eipOn[nic] {
			running = append(running, BillItem{Kind: BillPublicIPv4, Quantity: 1, Resource: inst.Name,
				Note: "assigned at each start, released at each stop"})
		}
		tags, _ := in["tags"].(map[string]any)
		idleStop, _ := tags[infra.IdleStopTag].(string)
		sleeps := idleStop != "" && idleStop != "0s" && in["instanceInitiatedShutdownBehavior"] == "stop"
		switch {
		case sleeps && keptAwake != "":
			for i := range running {
				running[i].Note = joinNotes(running[i].Note, keptAwake)
			}
			bill.Items = append(bill.Items, running...)
		case sleeps:
			for i := range running {
				running[i].Note = joinNotes(running[i].Note, "stops after "+idleStop+" idle")
			}
			bill.WhileNodesRun = append(bill.WhileNodesRun, running...)
			bill.Items = append(bill.Items, BillItem{Kind: BillInstance, Quantity: 0, Detail: running[0].Detail,
				Resource: inst.Name, Note: "stopped: it stops itself after " + idleStop + " idle"})
		default:
			for i := range running {
				running[i].Note = joinNotes(running[i].Note, "always on")
			}
			bill.Items = append(bill.Items, running...)
		}
	}
	bill.Items = append(bill.Items, monthlyItems(byType)...)
	bill.Items = append(bill.Items, agentStorage(byType)...)
	for _, b := range r.BakedImages() {
		// Not declared by the program: cmd/bake's images, which bill while they are kept.
		bill.Items = append(bill.Items, BillItem{Kind: BillSnapshot, Quantity: infra.BakeKeep * b.VolumeGiB,
			Detail: "at most", Resource: b.Image, Note: fmt.Sprintf("pool %s's baked images, up to %d kept by "+
				"cmd/bake (the one booted and older ones to roll back to), each its snapshot: the blocks written, "+
				"about %d GiB (an estimate)", b.Pool, infra.BakeKeep, BakedSnapshotEstimateGiB)})
	}

	templates := map[string]map[string]any{}
	for _, lt := range byType("aws:ec2/launchTemplate:LaunchTemplate") {
		templates[lt.ID] = inputs[lt.Type+"/"+lt.Name]
		bill.Items = append(bill.Items, cacheItems(lt)...)
	}
	for _, g := range byType("aws:autoscaling/group:Group") {
		bill.NodeHour = append(bill.NodeHour, poolHour(g, inputs[g.Type+"/"+g.Name], templates, mapsPublicIP))
		in := inputs[g.Type+"/"+g.Name]
		if wp, ok := in["warmPool"].(map[string]any); ok {
			bill.Items = append(bill.Items, warmPoolItems(g.Name, wp, bill.NodeHour[len(bill.NodeHour)-1])...)
		}
		if minSize, _ := in["minSize"].(float64); minSize > 0 {
			h := bill.NodeHour[len(bill.NodeHour)-1]
			bill.Items = append(bill.Items,
				BillItem{Kind: BillInstance, Quantity: int(minSize), Detail: strings.Join(h.InstanceTypes, "|"),
					Resource: g.Name, Note: "the pool's minSize never scales to zero"},
				BillItem{Kind: BillVolume, Quantity: int(minSize) * h.VolumeGiB, Detail: "gp3", Resource: g.Name,
					Note: "the minSize nodes' root volumes"},
				BillItem{Kind: BillPublicIPv4, Quantity: int(minSize) * h.PublicIPv4, Resource: g.Name,
					Note: "the minSize nodes' addresses"})
		}
	}
	bill.price()
	return bill
}

// price sets the prices of the bill's items from the region's table, and the idle items' monthly total when every
// one of them is priced.
func (b *IdleBill) price() {
	p, ok := PricesFor(b.Region)
	if !ok {
		return
	}
	b.PriceNote = p.Caveat()
	// To a hundredth of a cent: what the pricing pages give, and JSON without float noise.
	round := func(usd float64) *float64 {
		r := math.Round(usd*1e4) / 1e4
		return &r
	}
	total, all := 0.0, true
	for i := range b.Items {
		usd, ok := p.Monthly(b.Items[i])
		if !ok {
			all = false
			continue
		}
		b.Items[i].USD = round(usd)
		total += usd
	}
	if all {
		b.MonthlyUSD = round(total)
	}
	for i := range b.WhileNodesRun {
		if usd, ok := p.Hourly(b.WhileNodesRun[i]); ok {
			b.WhileNodesRun[i].USD = round(usd)
		}
	}
	for i := range b.NodeHour {
		if usd, ok := p.NodeHour(b.NodeHour[i]); ok {
			b.NodeHour[i].USDPerHour = round(usd)
		}
	}
}

// warmPoolItems are what a group's warm pool bills while the pool runs no node: the root volumes of its prepared
// instances in every state, and in the Running state the instances and their addresses too.
func warmPoolItems(group string, wp map[string]any, h PoolHour) []BillItem {
	size, _ := wp["minSize"].(float64)
	state := str(wp["poolState"])
	n := int(size)
	items := []BillItem{{Kind: BillVolume, Quantity: n * h.VolumeGiB, Detail: "gp3", Resource: group,
		Note: fmt.Sprintf("warm pool (%s): the prepared instances' root volumes", state)}}
	if state == "Running" {
		items = append(items,
			BillItem{Kind: BillInstance, Quantity: n, Detail: strings.Join(h.InstanceTypes, "|"), Resource: group,
				Note: "warm pool (Running): the prepared instances run"},
			BillItem{Kind: BillPublicIPv4, Quantity: n * h.PublicIPv4, Resource: group,
				Note: "warm pool (Running): the prepared instances' addresses"})
	}
	return items
}

// poolHour is one node of a group: its launch template's (or the group's overrides') instance types, the template's
// volumes, and the address its subnets map at launch.
func poolHour(g mockcloud.Resource, in map[string]any, templates map[string]map[string]any, mapsPublicIP map[string]bool) PoolHour {
	h := PoolHour{Pool: g.Name}
	for _, tag := range list(in["tags"]) {
		if t, _ := tag.(map[string]any); t["key"] == names.TagPool {
			h.Pool = str(t["value"])
		}
	}
	var ltID string
	if lt, ok := in["launchTemplate"].(map[string]any); ok {
		ltID = str(lt["id"])
	}
	if mixed, ok := in["mixedInstancesPolicy"].(map[string]any); ok {
		lt, _ := mixed["launchTemplate"].(map[string]any)
		spec, _ := lt["launchTemplateSpecification"].(map[string]any)
		ltID = str(spec["launchTemplateId"])
		for _, o := range list(lt["overrides"]) {
			if o, ok := o.(map[string]any); ok {
				h.InstanceTypes = append(h.InstanceTypes, str(o["instanceType"]))
			}
		}
		dist, _ := mixed["instancesDistribution"].(map[string]any)
		h.Spot = dist["onDemandPercentageAboveBaseCapacity"] == float64(0)
	}
	lt := templates[ltID]
	if len(h.InstanceTypes) == 0 && str(lt["instanceType"]) != "" {
		h.InstanceTypes = []string{str(lt["instanceType"])}
	}
	for _, m := range list(lt["blockDeviceMappings"]) {
		m, _ := m.(map[string]any)
		ebs, _ := m["ebs"].(map[string]any)
		gib, _ := ebs["volumeSize"].(float64)
		h.VolumeGiB += int(gib)
	}
	for _, s := range list(in["vpcZoneIdentifiers"]) {
		if mapsPublicIP[str(s)] {
			h.PublicIPv4 = 1
		}
	}
	return h
}

func joinNotes(a, b string) string {
	if a == "" {
		return b
	}
	return a + "; " + b
}

func str(v any) string {
	s, _ := v.(string)
	return s
}

func list(v any) []any {
	l, _ := v.([]any)
	return l
}

// BakedSnapshotEstimateGiB is a baked image's snapshot, an estimate not measured on EC2 (docs/baked-images.md): the
// stock image's used blocks and what the prepare step adds (packages, CRI-O, the pre-pulled images).
const BakedSnapshotEstimateGiB = 3

// units names a kind's quantity in the table.
var units = map[string]string{BillSnapshot: "GiB", BillS3Storage: "MiB", BillVolume: "GiB", BillPublicIPv4: "address", BillAlarm: "alarm", BillInstance: "running"}

// WriteIdleBill writes the bill as a table: quantities, and their prices where the plan has the region's.
func (b IdleBill) WriteIdleBill(w io.Writer) error {
	if b.PriceNote == "" {
		fmt.Fprintf(w, "\nIdle bill, every pool at its minimum (quantities; no price table for %s, "+
			"docs/costs.md says where to read prices):\n", b.Region)
	} else {
		fmt.Fprintln(w, "\nIdle bill, every pool at its minimum, per month:")
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	row := func(it BillItem, per string) {
		q := fmt.Sprintf("%d %s", it.Quantity, units[it.Kind])
		if it.Detail != "" {
			q += " " + it.Detail
		}
		price := ""
		switch {
		case it.USD != nil && per != "":
			price = hourlyDollars(*it.USD) + per
		case it.USD != nil:
			price = dollars(*it.USD)
		case b.PriceNote != "":
			price = "not priced"
		}
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\n", it.Kind, q, price, it.Resource, it.Note)
	}
	for _, it := range b.Items {
		row(it, "")
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	switch {
	case b.MonthlyUSD != nil:
		fmt.Fprintf(w, "  total at zero nodes: %s a month\n  prices: %s\n", dollars(*b.MonthlyUSD), b.PriceNote)
	case b.PriceNote != "":
		fmt.Fprintf(w, "  total at zero nodes: not priced (an item's price is not in the table)\n  prices: %s\n",
			b.PriceNote)
	}
	if len(b.WhileNodesRun) > 0 {
		fmt.Fprintln(w, "Per hour while any node runs, besides the nodes:")
		for _, it := range b.WhileNodesRun {
			row(it, "/h")
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	fmt.Fprintln(w, "Per node-hour:")
	for _, h := range b.NodeHour {
		capacity := "on-demand"
		if h.Spot {
			capacity = "spot"
		}
		price := ""
		switch {
		case h.USDPerHour != nil:
			price = "\t" + hourlyDollars(*h.USDPerHour) + "/h"
		case h.Spot && b.PriceNote != "":
			price = "\tspot prices move: not priced"
		case b.PriceNote != "":
			price = "\tnot priced"
		}
		fmt.Fprintf(tw, "  pool %s\t1 × %s (%s)\t%d GiB gp3\t%d public IPv4%s\n", h.Pool,
			strings.Join(h.InstanceTypes, " or "), capacity, h.VolumeGiB, h.PublicIPv4, price)
	}
	return tw.Flush()
}

// monthlyItems are the resources that bill a flat monthly fee while they exist: alarms and KMS keys.
func monthlyItems(byType func(string) []mockcloud.Resource) []BillItem {
	var items []BillItem
	for _, a := range byType("aws:cloudwatch/metricAlarm:MetricAlarm") {
		items = append(items, BillItem{Kind: BillAlarm, Quantity: 1, Resource: a.Name,
			Note: "bills in every state, also with no data while its instance is stopped"})
	}
	for _, k := range byType("aws:kms/key:Key") {
		items = append(items, BillItem{Kind: BillKMSKey, Quantity: 1, Resource: k.Name,
			Note: "identity.parameterKey create: bills per month while it exists, and for its 30-day deletion window"})
	}
	return items
}

// agentStorage is the node agent's objects in S3: the size of each built binary (none for the plan's stand-in).
// Every binary a stack replaces stays stored for agent.retentionDays besides.
func agentStorage(byType func(string) []mockcloud.Resource) []BillItem {
	var items []BillItem
	for _, o := range byType("aws:s3/bucketObjectv2:BucketObjectv2") {
		mib, note := 0, "the node agent; a binary the stack replaces stays stored for agent.retentionDays more"
		if src, ok := o.Inputs["source"]; ok && src.IsAsset() {
			if info, err := os.Stat(src.AssetValue().Path); err == nil {
				mib = int((info.Size() + 1<<20 - 1) >> 20)
			}
		} else {
			note = "the node agent's stand-in (not built): a built one is some MiB"
		}
		items = append(items, BillItem{Kind: BillS3Storage, Quantity: mib, Resource: o.Name, Note: note})
	}
	return items
}

// cacheItems are what a pool's build cache volumes bill while the pool runs no node, read from its launch template's
// node.json (node/nodeconfig: the cache the nodes attach): up to its most volumes of its size, kept at zero nodes.
func cacheItems(lt mockcloud.Resource) []BillItem {
	raw, err := decodeUserData(lt, "userData")
	if err != nil {
		return nil
	}
	files, err := cloudinit.Files(raw)
	if err != nil {
		return nil
	}
	for _, f := range files {
		if f.Path != nodeconfig.Path {
			continue
		}
		node, err := nodeconfig.Decode(strings.NewReader(f.Content))
		if err != nil || node.Cache == nil {
			return nil
		}
		c := node.Cache
		return []BillItem{{Kind: BillVolume, Quantity: c.MaxVolumes * c.SizeGiB, Detail: c.VolumeType, Resource: lt.Name,
			Note: fmt.Sprintf("pool %s's build cache: up to %d volumes of %d GiB kept at zero nodes (%d IOPS, %d MiB/s: "+
				"above gp3's 3000 and 125 they bill besides, not priced here)", node.PoolName, c.MaxVolumes, c.SizeGiB,
				c.IOPS, c.Throughput)}}
	}
	return nil
}
