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
	"regexp"
	"strings"
	"time"

	"github.com/pulumi/pulumi/sdk/v3/go/common/resource"
	"sigs.k8s.io/yaml"
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
		set("arn", "arn:aws:iam::"+Account+":role/"+nameOr())
		set("uniqueId", "AROA"+strings.ToUpper(shortHash(name)))
	case "aws:iam/instanceProfile:InstanceProfile":
		set("name", nameOr())
		set("arn", "arn:aws:iam::"+Account+":instance-profile/"+nameOr())
	case "aws:iam/user:User":
		set("name", nameOr())
		set("arn", "arn:aws:iam::"+Account+":user/"+nameOr())
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
		set("privateIp", "10.200.0."+fmt.Sprint(10+int(RandomBytes(name, 1)[0])%200))
		set("primaryNetworkInterfaceId", "eni-"+shortHash("eni/"+name))
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
		if id == "kube-public/cluster-info" {
			return clusterInfo(out)
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

var (
	amiArchInName = map[string]string{"x86_64": "x86_64", "arm64": "aarch64"}
	releaseInName = regexp.MustCompile(`-(\d+)-`)
)

// fedoraAMI answers an ec2.LookupAmi for the Fedora image the filters describe, and refuses a lookup whose own
// nameRegex would reject that image, as the real data source does when nothing matches.
func (c *Cloud) fedoraAMI(args resource.PropertyMap) (resource.PropertyMap, error) {
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
	if id := filters["image-id"]; id != "" {
		return resource.NewPropertyMapFromMap(map[string]any{
			"id": id, "imageId": id, "name": "pinned-image", "architecture": "x86_64",
			"rootDeviceName": "/dev/xvda", "rootDeviceType": "ebs", "virtualizationType": "hvm",
			"state": "available",
		}), nil
	}
	arch := filters["architecture"]
	nameArch, ok := amiArchInName[arch]
	if !ok {
		return nil, fmt.Errorf("mockcloud: getAmi needs an architecture filter of x86_64 or arm64, got %q", arch)
	}
	m := releaseInName.FindStringSubmatch(filters["name"])
	if m == nil {
		return nil, fmt.Errorf("mockcloud: getAmi name filter %q names no release", filters["name"])
	}
	release := m[1]
	name := fmt.Sprintf("Fedora-Cloud-Base-AmazonEC2.%s-%s-1.1", nameArch, release)
	if re, ok := args["nameRegex"]; ok && re.IsString() {
		rx, err := regexp.Compile(re.StringValue())
		if err != nil {
			return nil, fmt.Errorf("mockcloud: getAmi nameRegex: %w", err)
		}
		if !rx.MatchString(name) {
			return nil, fmt.Errorf("Your query returned no results: nameRegex %q rejects %q", re.StringValue(), name)
		}
	}
	sum := sha256.Sum256([]byte(name))
	id := "ami-0" + hex.EncodeToString(sum[:])[:16]
	return resource.NewPropertyMapFromMap(map[string]any{
		"id":                 id,
		"imageId":            id,
		"name":               name,
		"architecture":       arch,
		"rootDeviceName":     "/dev/sda1",
		"rootDeviceType":     "ebs",
		"virtualizationType": "hvm",
		"ownerId":            "125523088429",
		"state":              "available",
		"creationDate":       "2025-04-10T00:00:00.000Z",
	}), nil
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
func clusterInfo(out resource.PropertyMap) error {
	ca, _ := ClusterCA()
	kubeconfig, err := yaml.Marshal(map[string]any{
		"apiVersion": "v1",
		"kind":       "Config",
		"clusters": []any{map[string]any{
			"name": "",
			"cluster": map[string]any{
				"certificate-authority-data": base64.StdEncoding.EncodeToString(ca),
				"server":                     "https://192.168.10.10:6443",
			},
		}},
	})
	if err != nil {
		return fmt.Errorf("mockcloud: cluster-info: %w", err)
	}
	out["data"] = resource.NewPropertyValue(map[string]any{"kubeconfig": string(kubeconfig)})
	return nil
}
