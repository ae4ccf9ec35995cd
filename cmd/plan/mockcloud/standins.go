package mockcloud

import (
	"crypto/ed25519"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"math/big"
	"path"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/pulumi/pulumi/sdk/v3/go/common/resource"
	"sigs.k8s.io/yaml"

	"github.com/dynk8s/dynk8s/internal/names"
)

// Character sets of pulumi-random's RandomString.
const (
	lowerChars   = "abcdefghijklmnopqrstuvwxyz"
	upperChars   = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
	numericChars = "0123456789"
	specialChars = "!@#$%&*()-_=+[]{}<>:?"
)

// RandomBytes is the stand-in for random.RandomBytes named name: n bytes derived from the name.
func RandomBytes(name string, n int) []byte {
	out := make([]byte, 0, n)
	for i := 0; len(out) < n; i++ {
		sum := sha256.Sum256([]byte(fmt.Sprintf("dynk8s-mock/%s/%d", name, i)))
		out = append(out, sum[:]...)
	}
	return out[:n]
}

// RandomString is the stand-in for random.RandomString named name: length characters of charset derived from the
// name.
func RandomString(name string, length int, charset string) string {
	raw := RandomBytes(name, length)
	var b strings.Builder
	for _, c := range raw {
		b.WriteByte(charset[int(c)%len(charset)])
	}
	return b.String()
}

// computed fills in the outputs the provider would compute for a resource of type typ.
func (c *Cloud) computed(typ, name, id string, in, out resource.PropertyMap) error {
	str := func(k string) string {
		if v, ok := in[resource.PropertyKey(k)]; ok {
			if v.IsSecret() {
				v = v.SecretValue().Element
			}
			if v.IsString() {
				return v.StringValue()
			}
		}
		return ""
	}
	set := func(k string, v any) { out[resource.PropertyKey(k)] = resource.NewPropertyValue(v) }
	setSecret := func(k string, v any) {
		out[resource.PropertyKey(k)] = resource.MakeSecret(resource.NewPropertyValue(v))
	}
	arn := func(service, kind string) string {
		return fmt.Sprintf("arn:aws:%s:%s:%s:%s", service, c.Region, Account, kind)
	}
	nameOr := func() string {
		if n := str("name"); n != "" {
			return n
		}
		return id
	}

	if strings.HasPrefix(typ, "aws:s3/") {
		s3Computed(typ, name, id, in, set)
		return nil
	}
	switch typ {
	case "random:index/randomString:RandomString":
		length := 16
		if v, ok := in["length"]; ok && v.IsNumber() {
			length = int(v.NumberValue())
		}
		set("result", RandomString(name, length, randomCharset(in)))
	case "random:index/randomBytes:RandomBytes":
		n := 32
		if v, ok := in["length"]; ok && v.IsNumber() {
			n = int(v.NumberValue())
		}
		b := RandomBytes(name, n)
		setSecret("base64", base64.StdEncoding.EncodeToString(b))
		setSecret("hex", hex.EncodeToString(b))
	case "aws:iam/role:Role":
		set("name", nameOr())
		set("arn", "arn:aws:iam::"+Account+":role"+iamPath(in)+nameOr())
		set("uniqueId", "AROA"+strings.ToUpper(shortHash(name)))
	case "aws:iam/instanceProfile:InstanceProfile":
		set("name", nameOr())
		set("arn", "arn:aws:iam::"+Account+":instance-profile/"+nameOr())
	case "aws:iam/user:User":
		set("name", nameOr())
		set("arn", "arn:aws:iam::"+Account+":user"+iamPath(in)+nameOr())
	case "aws:kms/key:Key":
		keyID := uuidFrom(name)
		set("keyId", keyID)
		set("arn", "arn:aws:kms:"+c.Region+":"+Account+":key/"+keyID)
	case "aws:iam/policy:Policy":
		set("name", nameOr())
		set("arn", "arn:aws:iam::"+Account+":policy/"+nameOr())
	case "aws:iam/accessKey:AccessKey":
		set("secret", base64.StdEncoding.EncodeToString(RandomBytes(name+"/secret", 30)))
		set("sesSmtpPasswordV4", base64.StdEncoding.EncodeToString(RandomBytes(name+"/smtp", 32)))
		set("status", "Active")
	case "aws:ssm/parameter:Parameter":
		set("name", nameOr())
		set("arn", arn("ssm", "parameter/"+strings.TrimPrefix(nameOr(), "/")))
		set("version", 1)
	case "aws:ec2/launchTemplate:LaunchTemplate":
		set("arn", arn("ec2", "launch-template/"+id))
		set("latestVersion", 1)
		set("defaultVersion", 1)
	case "aws:ec2/instance:Instance":
		set("arn", arn("ec2", "instance/"+id))
		if ip := str("privateIp"); ip != "" {
			set("privateIp", ip)
		} else {
			set("privateIp", "10.200.0."+fmt.Sprint(10+int(RandomBytes(name, 1)[0])%200))
		}
		set("primaryNetworkInterfaceId", "eni-"+shortHash("eni/"+name))
		// The address EC2 assigns at launch (and anew at each start), from TEST-NET-1.
		set("publicIp", "192.0.2."+fmt.Sprint(1+int(RandomBytes("public/"+name, 1)[0])%250))
		set("instanceState", "running")
	case "aws:ec2/eip:Eip":
		set("publicIp", "203.0.113."+fmt.Sprint(1+int(RandomBytes(name, 1)[0])%250))
		set("allocationId", id)
	case "aws:ec2/vpc:Vpc":
		set("arn", arn("ec2", "vpc/"+id))
		set("mainRouteTableId", "rtb-"+shortHash("main/"+name))
		set("defaultSecurityGroupId", "sg-"+shortHash("default/"+name))
	case "aws:ec2/subnet:Subnet", "aws:ec2/securityGroup:SecurityGroup", "aws:ec2/routeTable:RouteTable",
		"aws:ec2/internetGateway:InternetGateway":
		kind := strings.ToLower(typ[strings.LastIndex(typ, ":")+1:])
		set("arn", arn("ec2", kind+"/"+id))
	case "aws:autoscaling/group:Group":
		set("name", nameOr())
		set("arn", arn("autoscaling", "autoScalingGroup:"+shortHash(name)+":autoScalingGroupName/"+nameOr()))
	case "kubernetes:core/v1:ConfigMap":
		switch id {
		case "kube-public/cluster-info":
			return clusterInfo(out, c.ClusterServer)
		case "kube-system/kubeadm-config":
			return kubeadmConfig(out, c.ClusterVersion, c.ClusterPodSubnet, c.ClusterServiceSubnet)
		}
	}
	return nil
}

// randomCharset follows pulumi-random's RandomString flags (all default true).
func randomCharset(in resource.PropertyMap) string {
	flag := func(k string) bool {
		if v, ok := in[resource.PropertyKey(k)]; ok && v.IsBool() {
			return v.BoolValue()
		}
		return true
	}
	var cs string
	if flag("lower") {
		cs += lowerChars
	}
	if flag("upper") {
		cs += upperChars
	}
	if flag("numeric") {
		cs += numericChars
	}
	if flag("special") {
		cs += specialChars
		if v, ok := in["overrideSpecial"]; ok && v.IsString() {
			cs = strings.TrimSuffix(cs, specialChars) + v.StringValue()
		}
	}
	return cs
}

// Image is one machine image of the stand-in catalog.
type Image struct {
	Name    string
	Arch    string // the EC2 architecture: x86_64 or arm64
	Created string // RFC 3339, as DescribeImages reports CreationDate
	Owner   string
}

// ID is the image's stable stand-in id.
func (i Image) ID() string {
	sum := sha256.Sum256([]byte(i.Name))
	return "ami-0" + hex.EncodeToString(sum[:])[:16]
}

// FedoraCatalog is a sample of what the Fedora Project's account publishes, with the traps a lookup must avoid:
// date-labelled compose images and prereleases that are newer than the GA image, other releases and architectures,
// and the gp2/standard variants of the old naming scheme.
var FedoraCatalog = func() []Image {
	const fedora = "125523088429"
	var out []Image
	add := func(name, arch, created string) {
		out = append(out, Image{Name: name, Arch: arch, Created: created, Owner: fedora})
	}
	for _, a := range []struct{ ec2, name string }{{"x86_64", "x86_64"}, {"arm64", "aarch64"}} {
		add("Fedora-Cloud-Base-AmazonEC2."+a.name+"-41-1.4", a.ec2, "2024-10-24T00:00:00.000Z")
		add("Fedora-Cloud-Base-AmazonEC2."+a.name+"-41-20250601.0", a.ec2, "2025-06-01T00:00:00.000Z")
		add("Fedora-Cloud-Base-AmazonEC2."+a.name+"-42-Prerelease-1.2", a.ec2, "2025-03-18T00:00:00.000Z")
		add("Fedora-Cloud-Base-AmazonEC2."+a.name+"-42-1.1", a.ec2, "2025-04-10T00:00:00.000Z")
		add("Fedora-Cloud-Base-AmazonEC2."+a.name+"-42-20251120.0", a.ec2, "2025-11-20T00:00:00.000Z")
		add("Fedora-Cloud-Base-AmazonEC2."+a.name+"-43-Prerelease-1.1", a.ec2, "2025-09-16T00:00:00.000Z")
		add("Fedora-Cloud-Base-AmazonEC2."+a.name+"-43-1.6", a.ec2, "2025-10-28T00:00:00.000Z")
		add("Fedora-Cloud-Base-AmazonEC2."+a.name+"-44-Prerelease-1.2", a.ec2, "2026-03-24T00:00:00.000Z")
		add("Fedora-Cloud-Base-AmazonEC2."+a.name+"-44-1.7", a.ec2, "2026-04-28T00:00:00.000Z")
		add("Fedora-Cloud-Base-AmazonEC2."+a.name+"-44-20260901.0", a.ec2, "2026-09-01T00:00:00.000Z")
		for _, region := range []string{"eu-central-1", "us-west-2"} {
			for _, vol := range []string{"gp3", "gp2", "standard"} {
				add("Fedora-Cloud-Base-38-1.6."+a.name+"-hvm-"+region+"-"+vol+"-0", a.ec2, "2023-04-13T00:00:00.000Z")
			}
			add("Fedora-Cloud-Base-39_Beta-1.1."+a.name+"-hvm-"+region+"-gp3-0", a.ec2, "2023-09-12T00:00:00.000Z")
			add("Fedora-Cloud-Base-39-1.5."+a.name+"-hvm-"+region+"-gp3-0", a.ec2, "2023-11-03T00:00:00.000Z")
			add("Fedora-Cloud-Base-39-20240912.0."+a.name+"-hvm-"+region+"-gp3-0", a.ec2, "2024-09-12T00:00:00.000Z")
		}
	}
	return out
}()

// SelectImage evaluates an image lookup as EC2 and the data source do: the owner, name (glob) and architecture
// filters on the API side, then nameRegex on the client side, then the most recent by creation date.
func SelectImage(images []Image, owners []string, nameGlob, arch, nameRegex string) (Image, error) {
	var rx *regexp.Regexp
	if nameRegex != "" {
		var err error
		if rx, err = regexp.Compile(nameRegex); err != nil {
			return Image{}, fmt.Errorf("nameRegex: %w", err)
		}
	}
	var best *Image
	for i := range images {
		im := &images[i]
		if len(owners) > 0 && !slices.Contains(owners, im.Owner) || arch != "" && im.Arch != arch {
			continue
		}
		if ok, _ := path.Match(nameGlob, im.Name); nameGlob != "" && !ok {
			continue
		}
		if rx != nil && !rx.MatchString(im.Name) {
			continue
		}
		if best == nil || im.Created > best.Created {
			best = im
		}
	}
	if best == nil {
		return Image{}, fmt.Errorf("your query returned no results (name %q, architecture %q, nameRegex %q)",
			nameGlob, arch, nameRegex)
	}
	return *best, nil
}

// PinnedArmImage is the one image id the stand-in answers as arm64; every other id pinned by amiId is x86_64.
const PinnedArmImage = "ami-0a64a64a64a64a64a"

// AMIFilters are an ec2.LookupAmi's filters, by name: each filter's first value.
func AMIFilters(args resource.PropertyMap) map[string]string {
	filters := map[string]string{}
	if f, ok := args["filters"]; ok && f.IsArray() {
		for _, e := range f.ArrayValue() {
			if !e.IsObject() {
				continue
			}
			o := e.ObjectValue()
			if vs := o["values"]; vs.IsArray() && len(vs.ArrayValue()) > 0 {
				filters[o["name"].StringValue()] = vs.ArrayValue()[0].StringValue()
			}
		}
	}
	return filters
}

// BakeTagFilter is the filter of a baked image's lookup by its identity (infra.BakeTag): the lookup the mock answers
// with a stand-in baked image.
const BakeTagFilter = "tag:dynk8s:bake-sha256"

// ami answers an ec2.LookupAmi: a baked image by its tags, an image pinned by id, or a Fedora image from
// FedoraCatalog.
func (c *Cloud) ami(args resource.PropertyMap) (resource.PropertyMap, error) {
	filters := AMIFilters(args)
	if _, ok := filters[BakeTagFilter]; ok {
		return c.bakedAMI(filters)
	}
	return c.fedoraAMI(args, filters)
}

// NoResults is the provider's error for an image lookup that matches nothing (the aws_ami data source's).
const NoResults = "Your query returned no results. Please change your search criteria and try again."

// BakedSnapshotGiB is the stand-in baked images' root snapshot size: a bake instance's root volume.
const BakedSnapshotGiB = 10

// StandInBakedImage is the id of the stand-in baked image of a pool with the identity bakeID.
func StandInBakedImage(cluster, pool, bakeID string) string {
	sum := sha256.Sum256([]byte("baked/" + cluster + "/" + pool + "/" + bakeID))
	return "ami-0" + hex.EncodeToString(sum[:])[:16]
}

// bakedAMI answers the lookup of a pool's baked image by its tags (cluster, pool, identity) as EC2 would after a
// bake: an image of this account, tagged as cmd/bake tags it, of the pool's architecture (BakedArch), with the Fedora
// images' root device, whose instance it was imaged from; or no result for a pool in NoBakedImage.
func (c *Cloud) bakedAMI(filters map[string]string) (resource.PropertyMap, error) {
	cluster, pool, bakeID := filters["tag:"+names.TagCluster], filters["tag:"+names.TagPool], filters[BakeTagFilter]
	if slices.Contains(c.NoBakedImage, pool) {
		return nil, fmt.Errorf("invoking aws:ec2/getAmi:getAmi: %s", NoResults)
	}
	arch := c.BakedArch[pool]
	if arch == "" {
		arch = "x86_64"
	}
	id := StandInBakedImage(cluster, pool, bakeID)
	return resource.NewPropertyMapFromMap(map[string]any{
		"id": id, "imageId": id, "name": cluster + "-" + pool + "-stand-in-bake", "architecture": arch,
		"rootDeviceName": "/dev/sda1", "rootDeviceType": "ebs", "virtualizationType": "hvm", "ownerId": Account,
		"state": "available", "creationDate": "2026-05-01T00:00:00.000Z",
		"tags": map[string]any{names.TagCluster: cluster, names.TagPool: pool,
			strings.TrimPrefix(BakeTagFilter, "tag:"): bakeID},
		"blockDeviceMappings": rootMapping("/dev/sda1", id, BakedSnapshotGiB),
	}), nil
}

// fedoraAMI answers an ec2.LookupAmi from FedoraCatalog, or an image pinned by id.
func (c *Cloud) fedoraAMI(args resource.PropertyMap, filters map[string]string) (resource.PropertyMap, error) {
	if id := filters["image-id"]; id != "" {
		arch := "x86_64"
		if id == PinnedArmImage {
			arch = "arm64"
		}
		return resource.NewPropertyMapFromMap(map[string]any{
			"id": id, "imageId": id, "name": "pinned-image", "architecture": arch,
			"rootDeviceName": "/dev/xvda", "rootDeviceType": "ebs", "virtualizationType": "hvm",
			"state": "available", "blockDeviceMappings": rootMapping("/dev/xvda", id, 8),
		}), nil
	}
	var owners []string
	if o, ok := args["owners"]; ok && o.IsArray() {
		for _, e := range o.ArrayValue() {
			owners = append(owners, e.StringValue())
		}
	}
	regex := ""
	if re, ok := args["nameRegex"]; ok && re.IsString() {
		regex = re.StringValue()
	}
	im, err := SelectImage(FedoraCatalog, owners, filters["name"], filters["architecture"], regex)
	if err != nil {
		return nil, err
	}
	return resource.NewPropertyMapFromMap(map[string]any{
		"id":                 im.ID(),
		"imageId":            im.ID(),
		"name":               im.Name,
		"architecture":       im.Arch,
		"rootDeviceName":     "/dev/sda1",
		"rootDeviceType":     "ebs",
		"virtualizationType": "hvm",
		"ownerId":            im.Owner,
		"state":              "available",
		"creationDate":       im.Created,
		// A plausible root snapshot size; the real one is the image's own (describe-images, BlockDeviceMappings).
		"blockDeviceMappings": rootMapping("/dev/sda1", im.ID(), FedoraSnapshotGiB),
	}), nil
}

// FedoraSnapshotGiB is the stand-in Fedora images' root snapshot size.
const FedoraSnapshotGiB = 5

// rootMapping is an image's block device mappings as the aws_ami data source reports them: the root device's, with
// the ebs map keyed as terraform-provider-aws flattens it.
func rootMapping(device, image string, gib int) []any {
	return []any{map[string]any{
		"deviceName": device, "virtualName": "", "noDevice": "",
		"ebs": map[string]any{
			"delete_on_termination": "true", "encrypted": "false", "iops": "3000", "throughput": "125",
			"snapshot_id": "snap-" + shortHash("snap/"+image), "volume_size": fmt.Sprint(gib), "volume_type": "gp3",
		},
	}}
}

// ClusterCA is the on-prem cluster's CA certificate as the stand-in cluster-info carries it (PEM), and its kubeadm
// discovery hash. It is fixed: an Ed25519 key from a constant seed, signed deterministically.
func ClusterCA() (certPEM []byte, caCertHash string) {
	seed := sha256.Sum256([]byte("dynk8s-mock-cluster-ca"))
	key := ed25519.NewKeyFromSeed(seed[:])
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "kubernetes"},
		NotBefore:             time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC),
		NotAfter:              time.Date(2036, 1, 1, 0, 0, 0, 0, time.UTC),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(nil, tmpl, tmpl, key.Public(), key)
	if err != nil {
		panic("mockcloud: cluster CA: " + err.Error()) // a fixed template that cannot fail
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		panic("mockcloud: cluster CA: " + err.Error())
	}
	sum := sha256.Sum256(cert.RawSubjectPublicKeyInfo)
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), "sha256:" + hex.EncodeToString(sum[:])
}

// clusterInfo fills kube-public/cluster-info as kubeadm init leaves it: a kubeconfig with the CA and no user.
func clusterInfo(out resource.PropertyMap, server string) error {
	if server == "" {
		server = "https://192.168.10.10:6443"
	}
	ca, _ := ClusterCA()
	kubeconfig, err := yaml.Marshal(map[string]any{
		"apiVersion": "v1",
		"kind":       "Config",
		"clusters": []any{map[string]any{
			"name": "",
			"cluster": map[string]any{
				"certificate-authority-data": base64.StdEncoding.EncodeToString(ca),
				"server":                     server,
			},
		}},
	})
	if err != nil {
		return fmt.Errorf("mockcloud: cluster-info: %w", err)
	}
	out["data"] = resource.NewPropertyValue(map[string]any{"kubeconfig": string(kubeconfig)})
	return nil
}

// kubeadmConfig answers the ConfigMap kubeadm init writes: the ClusterConfiguration with the control plane's version
// and its networking.
func kubeadmConfig(out resource.PropertyMap, version, podSubnet, serviceSubnet string) error {
	if version == "" {
		version = "v1.34.4"
	}
	if serviceSubnet == "" {
		serviceSubnet = "10.96.0.0/12"
	}
	networking := map[string]any{"serviceSubnet": serviceSubnet, "dnsDomain": "cluster.local"}
	if podSubnet != "" {
		networking["podSubnet"] = podSubnet
	}
	cc, err := yaml.Marshal(map[string]any{
		"apiVersion": "kubeadm.k8s.io/v1beta4", "kind": "ClusterConfiguration", "kubernetesVersion": version,
		"networking": networking,
	})
	if err != nil {
		return fmt.Errorf("mockcloud: kubeadm-config: %w", err)
	}
	out["data"] = resource.NewPropertyValue(map[string]any{"ClusterConfiguration": string(cc)})
	return nil
}

// kmsKey answers kms.LookupKey for the default EBS key: the AWS managed key behind alias/aws/ebs, or the
// customer-managed key Cloud.EBSDefaultKey names.
func (c *Cloud) kmsKey(args resource.PropertyMap) (resource.PropertyMap, error) {
	id := args["keyId"].StringValue()
	manager, arn := "CUSTOMER", id
	if strings.HasSuffix(id, "alias/aws/ebs") {
		manager = "AWS"
		arn = "arn:aws:kms:" + c.Region + ":" + Account + ":key/" + shortHash("aws/ebs")
	} else if id != c.EBSDefaultKey {
		return nil, fmt.Errorf("mockcloud: NotFoundException: Key '%s' does not exist", id)
	}
	return resource.NewPropertyMapFromMap(map[string]any{
		"id": arn, "arn": arn, "keyId": id, "keyManager": manager, "keyState": "Enabled", "enabled": true,
	}), nil
}

// iamPath is an IAM resource's path as its ARN holds it ("/" when none is given), as IAM puts it between the
// resource type and the name.
func iamPath(in resource.PropertyMap) string {
	if v, ok := in["path"]; ok && v.IsString() && v.StringValue() != "" {
		return v.StringValue()
	}
	return "/"
}

// uuidFrom is a UUID-shaped id derived from name, so the same program gets the same key ids.
func uuidFrom(name string) string {
	h := sha256.Sum256([]byte(name))
	x := hex.EncodeToString(h[:16])
	return x[0:8] + "-" + x[8:12] + "-" + x[12:16] + "-" + x[16:20] + "-" + x[20:32]
}

// s3Computed fills in what S3 computes: a bucket's name and ARN, an object's version id.
func s3Computed(typ, name, id string, in resource.PropertyMap, set func(string, any)) {
	switch typ {
	case "aws:s3/bucketV2:BucketV2":
		set("bucket", id)
		set("arn", "arn:aws:s3:::"+id)
	case "aws:s3/bucketObjectv2:BucketObjectv2":
		// S3 gives every write of a versioned bucket's object a new version id: one per content here.
		content := ""
		if m, ok := in["metadata"]; ok && m.IsObject() {
			if v, ok := m.ObjectValue()["sha256"]; ok && v.IsString() {
				content = v.StringValue()
			}
		}
		set("versionId", shortHash("version/"+name+"/"+content))
	}
}

// bucketName is the stand-in for the name S3 gives a bucket declared with a bucketPrefix (Pulumi appends 26
// characters of its own) or the bucket's name.
func bucketName(name string, in resource.PropertyMap) string {
	if v, ok := in["bucket"]; ok && v.IsString() {
		return v.StringValue()
	}
	prefix := "terraform-"
	if v, ok := in["bucketPrefix"]; ok && v.IsString() {
		prefix = v.StringValue()
	}
	sum := sha256.Sum256([]byte("bucket/" + name))
	return prefix + hex.EncodeToString(sum[:])[:26]
}
