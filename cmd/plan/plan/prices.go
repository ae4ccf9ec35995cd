package plan

import (
	"fmt"
	"math"
	"strings"
)

// HoursPerMonth is the month AWS's pricing pages bill an hourly price over (730 hours).
const HoursPerMonth = 730

// Prices are AWS's on-demand list prices for one region, in US dollars, as the plan prices the idle bill with (no
// network at plan time: the table is in the code, with its date and source).
type Prices struct {
	Region string
	// AsOf and Source say when and where the prices were read.
	AsOf, Source string
	// GP3GiBMonth is a gp3 volume's storage, per GiB-month.
	GP3GiBMonth float64
	// PublicIPv4Hour is a public IPv4 address, per hour (an Elastic IP, or one assigned to a running instance).
	PublicIPv4Hour float64
	// AlarmMonth is a CloudWatch standard-resolution alarm, per alarm-month (the free tier's first 10 not taken off).
	AlarmMonth float64
	// KMSKeyMonth is a customer-managed KMS key, per key-month (requests within the free tier at this volume).
	KMSKeyMonth float64
	// S3GBMonth is S3 Standard storage, per GB-month.
	S3GBMonth float64
	// SnapshotGBMonth is EBS snapshot storage (standard tier), per GB-month of the blocks stored.
	SnapshotGBMonth float64
	// InstanceHour are Linux on-demand instances, per hour, by type; a type not here is not priced.
	InstanceHour map[string]float64
	// Estimates name the figures above that are estimates rather than read from a pricing page.
	Estimates []string
}

// pricesSource is where every table's figures come from.
const pricesSource = "the EC2 On-Demand, EBS, Amazon VPC (Public IPv4 Address), CloudWatch, KMS and S3 pricing pages"

// priceTables are the regions the plan prices: the example stacks'. Read in 2025 and not re-checked since; a
// region not here gets quantities only.
var priceTables = map[string]Prices{
	"eu-central-1": {
		Region: "eu-central-1", AsOf: "2025", Source: pricesSource,
		GP3GiBMonth: 0.0952, PublicIPv4Hour: 0.005, AlarmMonth: 0.10, KMSKeyMonth: 1, S3GBMonth: 0.024,
		SnapshotGBMonth: 0.055,
		InstanceHour: map[string]float64{"t4g.micro": 0.0096, "t4g.small": 0.0192, "c7i.2xlarge": 0.41,
			"c7g.2xlarge": 0.35},
		Estimates: []string{"S3 (about $0.024)", "the snapshot price (from us-east-1's $0.05)",
			"c7i.2xlarge and c7g.2xlarge (rounded)"},
	},
	"eu-west-1": {
		Region: "eu-west-1", AsOf: "2025", Source: pricesSource,
		GP3GiBMonth: 0.088, PublicIPv4Hour: 0.005, AlarmMonth: 0.10, KMSKeyMonth: 1, S3GBMonth: 0.024,
		SnapshotGBMonth: 0.05,
		InstanceHour:    map[string]float64{"t4g.micro": 0.0092, "t4g.small": 0.0184},
		Estimates:       []string{"S3 (about $0.024)", "the snapshot price (from us-east-1's $0.05)"},
	},
}

// PricesFor is the price table of a region, if the plan has one.
func PricesFor(region string) (Prices, bool) {
	p, ok := priceTables[region]
	return p, ok
}

// Monthly is what an idle-bill item costs a month at these prices; ok is false for an instance type the table
// lacks. An item of several instance types ("a|b", a group's order of preference) is priced at the first.
func (p Prices) Monthly(it BillItem) (usd float64, ok bool) {
	q := float64(it.Quantity)
	switch it.Kind {
	case BillVolume:
		return q * p.GP3GiBMonth, true
	case BillPublicIPv4:
		return q * p.PublicIPv4Hour * HoursPerMonth, true
	case BillAlarm:
		return q * p.AlarmMonth, true
	case BillKMSKey:
		return q * p.KMSKeyMonth, true
	case BillS3Storage:
		return q / 1024 * p.S3GBMonth, true
	case BillSnapshot:
		return q * p.SnapshotGBMonth, true
	case BillInstance:
		if it.Quantity == 0 {
			return 0, true
		}
		h, ok := p.InstanceHour[strings.Split(it.Detail, "|")[0]]
		return q * h * HoursPerMonth, ok
	}
	return 0, false
}

// Hourly is what an item that bills per hour (an instance, an address) costs an hour; ok is false for a kind that
// does not bill by the hour or a type the table lacks.
func (p Prices) Hourly(it BillItem) (usd float64, ok bool) {
	switch it.Kind {
	case BillInstance, BillPublicIPv4:
		m, ok := p.Monthly(it)
		return m / HoursPerMonth, ok
	}
	return 0, false
}

// NodeHour is what one node of a pool costs an hour on demand: its first instance type, its root volume and its
// address; ok is false for a spot pool (spot prices move) or a type the table lacks.
func (p Prices) NodeHour(h PoolHour) (usd float64, ok bool) {
	if h.Spot || len(h.InstanceTypes) == 0 {
		return 0, false
	}
	inst, ok := p.InstanceHour[h.InstanceTypes[0]]
	if !ok {
		return 0, false
	}
	return inst + float64(h.VolumeGiB)*p.GP3GiBMonth/HoursPerMonth + float64(h.PublicIPv4)*p.PublicIPv4Hour, true
}

// dollars prints an amount as the bill does: cents, and "<$0.01" for a positive amount below a cent.
func dollars(usd float64) string {
	if usd > 0 && usd < 0.005 {
		return "<$0.01"
	}
	return fmt.Sprintf("$%.2f", math.Round(usd*100)/100)
}

// hourlyDollars prints an hourly amount to a hundredth of a cent, as the pricing pages give hourly prices.
func hourlyDollars(usd float64) string {
	return fmt.Sprintf("$%.4f", usd)
}

// Caveat is the line under a priced bill: the table's date, source and estimates.
func (p Prices) Caveat() string {
	s := fmt.Sprintf("%s list prices as of %s, from %s; not re-checked since: check them for your date", p.Region,
		p.AsOf, p.Source)
	if len(p.Estimates) > 0 {
		s += "; estimates: " + strings.Join(p.Estimates, ", ")
	}
	return s
}
