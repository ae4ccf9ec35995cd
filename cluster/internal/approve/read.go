package approve

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/sha256"
	"crypto/x509"
	"encoding/asn1"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"regexp"
	"slices"

	certificatesv1 "k8s.io/api/certificates/v1"

	"github.com/dynk8s/dynk8s/internal/names"
)

// KubeletClientSigner is the signer of a kubelet's client certificate, the only signer whose CSRs this loop judges
// (kubernetes staging/src/k8s.io/api/certificates/v1/types.go, KubeAPIServerClientKubeletSignerName).
const KubeletClientSigner = certificatesv1.KubeAPIServerClientKubeletSignerName

// maxRequestBytes bounds spec.request: a kubelet's request (an ECDSA P-256 key, the subject, no extensions) is
// under 600 bytes of PEM, so a much larger one is no kubelet's and is denied unread.
const maxRequestBytes = 4096

// Reason is the short code of a decision, the reason label of dynk8s_controller_csr_decisions_total: a bounded set,
// the constants below.
type Reason string

// The decisions' reason codes. The first group needs nothing but the CSR (Read); the second needs EC2's view of
// the instance, the Nodes and the approval record.
const (
	ReasonUsages    Reason = "usages"    // usages other than a kubelet client certificate's
	ReasonRequest   Reason = "request"   // spec.request is not exactly one CERTIFICATE REQUEST PEM block
	ReasonPKCS10    Reason = "pkcs10"    // the block is not a plain PKCS#10 request as Go reads it
	ReasonSignature Reason = "signature" // its signature does not verify
	ReasonKey       Reason = "key"       // its key is not ECDSA P-256
	ReasonSubject   Reason = "subject"   // its subject is not exactly O=system:nodes, CN=system:node:<instance id>
	ReasonExtension Reason = "extension" // it has attributes or extensions

	ReasonNotLive        Reason = "not-live"        // no pending or running instance of a group of the cluster
	ReasonPool           Reason = "pool"            // an instance of another pool
	ReasonNodeExists     Reason = "node-exists"     // a Node of that name exists
	ReasonApprovedBefore Reason = "approved-before" // the record names another CSR for that instance
	ReasonKeyMismatch    Reason = "key-mismatch"    // the instance marked another key
	ReasonNoKeyMark      Reason = "no-key-mark"     // the instance marked no key within KeyMarkWait
	ReasonSuperseded     Reason = "superseded"      // a newer CSR for the same instance is the one approved

	// ReasonLiveInstance is the reason label of every approval.
	ReasonLiveInstance Reason = "live-instance"
)

// Denial is why a CSR is denied: its reason code and the message its Denied condition and Event carry.
type Denial struct {
	Reason  Reason
	Message string
}

func (d *Denial) Error() string { return d.Message }

func deny(r Reason, format string, args ...any) *Denial {
	return &Denial{Reason: r, Message: fmt.Sprintf(format, args...)}
}

// ErrNotOurs is Read's answer for a CSR this loop never touches: another signer, another group (on-prem kubelets,
// kubeadm's token group), a renewal (the kubelet's own certificate, not the bootstrap group), or one already
// approved, denied, failed or signed.
var ErrNotOurs = errors.New("not a pending kubelet client CSR of the bootstrap group")

// Claim is what a well-formed request of the bootstrap group claims: the instance it is for, and the lowercase hex
// sha256 of the DER SubjectPublicKeyInfo of its key (what the instance marks in names.TagKubeletKey).
type Claim struct {
	Node      string
	KeySHA256 string
}

var (
	oidCommonName   = asn1.ObjectIdentifier{2, 5, 4, 3}
	oidOrganization = asn1.ObjectIdentifier{2, 5, 4, 10}
	nodeNameRE      = regexp.MustCompile(`^system:node:(` + names.InstanceIDPattern + `)$`)
)

// Pending reports whether csr has no condition and no certificate: no one has decided it yet.
func Pending(csr *certificatesv1.CertificateSigningRequest) bool {
	return len(csr.Status.Conditions) == 0 && len(csr.Status.Certificate) == 0
}

// Ours reports whether csr is a pending kubelet client CSR of group, the only CSRs this loop writes to.
func Ours(csr *certificatesv1.CertificateSigningRequest, group string) bool {
	return csr.Spec.SignerName == KubeletClientSigner && slices.Contains(csr.Spec.Groups, group) && Pending(csr)
}

// Read judges one CSR by itself: ErrNotOurs for one to leave alone, a *Denial for a request no kubelet makes, else
// the Claim its request makes. It reads spec.request as the API server and the kubelet client signer do: the
// first PEM block pem.Decode finds, parsed by x509.ParseCertificateRequest, whose Subject the signer copies into
// the certificate (kubernetes pkg/apis/certificates/helpers.go ParseCSR, pkg/controller/certificates/authority
// authority.go Sign). Where Go is laxer than a kubelet's request needs, it is stricter: the block must be the only
// text (but whitespace), the request's structure exactly PKCS#10's with no attribute, the key ECDSA P-256 (what
// the kubelet generates: kubernetes pkg/kubelet/certificate/bootstrap/bootstrap.go, keyutil.LoadOrGenerateKeyFile),
// the subject exactly two RDNs O=system:nodes and CN=system:node:<instance id> in PrintableString or UTF8String.
// The round-4 security review's crafted CSRs show what Go alone would let through (a T61, BMP or IA5 CN, the last of
// two CNs, an extra element anywhere, version 1).
func Read(csr *certificatesv1.CertificateSigningRequest, group string) (Claim, error) {
	if !Ours(csr, group) {
		return Claim{}, ErrNotOurs
	}
	if d := readUsages(csr.Spec.Usages); d != nil {
		return Claim{}, d
	}
	der, d := readPEM(csr.Spec.Request)
	if d != nil {
		return Claim{}, d
	}
	cr, err := x509.ParseCertificateRequest(der)
	if err != nil {
		return Claim{}, deny(ReasonPKCS10, "the request is no PKCS#10 request: %v", err)
	}
	if err := cr.CheckSignature(); err != nil {
		return Claim{}, deny(ReasonSignature, "the request's signature does not verify: %v", err)
	}
	if d := readStructure(der); d != nil {
		return Claim{}, d
	}
	if k, ok := cr.PublicKey.(*ecdsa.PublicKey); !ok || k.Curve != elliptic.P256() {
		return Claim{}, deny(ReasonKey, "the request's key is a %T, not an ECDSA P-256 key as a kubelet's", cr.PublicKey)
	}
	node, d := readSubject(cr.RawSubject)
	if d != nil {
		return Claim{}, d
	}
	// What the signer copies into the certificate must say the same (a second reading, by Go's own rules).
	if want := "system:node:" + node; cr.Subject.CommonName != want ||
		!slices.Equal(cr.Subject.Organization, []string{"system:nodes"}) || len(cr.Subject.Names) != 2 {
		return Claim{}, deny(ReasonSubject, "Go reads the subject as CN=%q O=%q, want CN=%q O=[\"system:nodes\"]",
			cr.Subject.CommonName, cr.Subject.Organization, want)
	}
	sum := sha256.Sum256(cr.RawSubjectPublicKeyInfo)
	return Claim{Node: node, KeySHA256: hex.EncodeToString(sum[:])}, nil
}

// kubeletUsages are the usage sets a kubelet's bootstrap CSR has, sorted: digital signature and client auth, plus
// key encipherment when its key is RSA (kubernetes pkg/kubelet/certificate/bootstrap/bootstrap.go, requestNodeCertificate).
// The key must be ECDSA here, but the script before this loop allowed both sets and so does this one.
var kubeletUsages = [][]certificatesv1.KeyUsage{
	{certificatesv1.UsageClientAuth, certificatesv1.UsageDigitalSignature},
	{certificatesv1.UsageClientAuth, certificatesv1.UsageDigitalSignature, certificatesv1.UsageKeyEncipherment},
}

func readUsages(usages []certificatesv1.KeyUsage) *Denial {
	sorted := slices.Sorted(slices.Values(usages))
	for _, u := range kubeletUsages {
		if slices.Equal(sorted, u) {
			return nil
		}
	}
	return deny(ReasonUsages, "usages %s are not a kubelet client certificate's", quoted(usages))
}

// readPEM is the DER of the request's one PEM block: the block pem.Decode finds first must be the only block,
// with only whitespace before and after it, of type CERTIFICATE REQUEST and without headers, so that there is no
// text around it that a reader could take for something else.
func readPEM(request []byte) ([]byte, *Denial) {
	if len(request) > maxRequestBytes {
		return nil, deny(ReasonRequest, "the request is %d bytes, more than a kubelet's request (%d)",
			len(request), maxRequestBytes)
	}
	const notOne = "the request is not exactly one CERTIFICATE REQUEST PEM block"
	text := bytes.TrimLeft(request, " \t\r\n")
	if bytes.Count(text, []byte("-----BEGIN")) != 1 || !bytes.HasPrefix(text, []byte("-----BEGIN ")) {
		return nil, deny(ReasonRequest, notOne)
	}
	block, rest := pem.Decode(text)
	if block == nil || len(bytes.TrimSpace(rest)) != 0 {
		return nil, deny(ReasonRequest, notOne)
	}
	if block.Type != "CERTIFICATE REQUEST" || len(block.Headers) != 0 {
		return nil, deny(ReasonRequest, "%s: a %q block with %d headers", notOne, block.Type, len(block.Headers))
	}
	return block.Bytes, nil
}

// children are the DER elements inside v, which must be a constructed universal SEQUENCE (or the tag given).
func children(v asn1.RawValue) ([]asn1.RawValue, error) {
	var kids []asn1.RawValue
	for rest := v.Bytes; len(rest) > 0; {
		var kid asn1.RawValue
		var err error
		if rest, err = asn1.Unmarshal(rest, &kid); err != nil {
			return nil, err
		}
		kids = append(kids, kid)
	}
	return kids, nil
}

// readStructure checks what x509.ParseCertificateRequest lets pass: the request is exactly SEQUENCE
// {CertificationRequestInfo, AlgorithmIdentifier, BIT STRING}, the info exactly SEQUENCE {version 0, subject,
// SubjectPublicKeyInfo, [0] attributes} with no attribute at all (so no extension request either) (RFC 2986
// section 4).
func readStructure(der []byte) *Denial {
	var outer asn1.RawValue
	if rest, err := asn1.Unmarshal(der, &outer); err != nil || len(rest) != 0 {
		return deny(ReasonPKCS10, "the request is no plain PKCS#10 request: trailing bytes or %v", err)
	}
	parts, err := children(outer)
	if err != nil || len(parts) != 3 || !isSequence(parts[0]) {
		return deny(ReasonPKCS10, "the request is no plain PKCS#10 request: %d parts, want 3", len(parts))
	}
	info, err := children(parts[0])
	if err != nil || len(info) != 4 {
		return deny(ReasonPKCS10, "the request is no plain PKCS#10 request: a request info of %d parts, want 4",
			len(info))
	}
	var version int
	if rest, err := asn1.Unmarshal(info[0].FullBytes, &version); err != nil || len(rest) != 0 || version != 0 {
		return deny(ReasonPKCS10, "the request is no plain PKCS#10 request: version %d, want 0", version)
	}
	if a := info[3]; a.Class != asn1.ClassContextSpecific || a.Tag != 0 || len(a.Bytes) != 0 {
		return deny(ReasonExtension, "the request has attributes or extensions")
	}
	return nil
}

func isSequence(v asn1.RawValue) bool {
	return v.Class == asn1.ClassUniversal && v.Tag == asn1.TagSequence && v.IsCompound
}

// readSubject is the instance id of a subject that is exactly two RDNs of one attribute each, O=system:nodes and
// CN=system:node:<instance id> (either order), each value a PrintableString or UTF8String (the tags Go's x509
// writes: asn1 marshals a string PrintableString when it can, else UTF8String).
func readSubject(raw []byte) (string, *Denial) {
	var seq asn1.RawValue
	if rest, err := asn1.Unmarshal(raw, &seq); err != nil || len(rest) != 0 || !isSequence(seq) {
		return "", deny(ReasonSubject, "the subject is not one SEQUENCE")
	}
	rdns, err := children(seq)
	if err != nil || len(rdns) != 2 {
		return "", deny(ReasonSubject, "the subject is %d RDNs, want exactly O=system:nodes and "+
			"CN=system:node:<instance id>", len(rdns))
	}
	values := map[string][]string{}
	for _, rdn := range rdns {
		atvs, err := children(rdn)
		if err != nil || rdn.Tag != asn1.TagSet || len(atvs) != 1 {
			return "", deny(ReasonSubject, "an RDN of the subject is %d attributes, want one", len(atvs))
		}
		parts, err := children(atvs[0])
		if err != nil || !isSequence(atvs[0]) || len(parts) != 2 {
			return "", deny(ReasonSubject, "an attribute of the subject is %d parts, want 2", len(parts))
		}
		var oid asn1.ObjectIdentifier
		if rest, err := asn1.Unmarshal(parts[0].FullBytes, &oid); err != nil || len(rest) != 0 {
			return "", deny(ReasonSubject, "an attribute type of the subject is no OID")
		}
		v := parts[1]
		if v.Class != asn1.ClassUniversal || v.IsCompound ||
			(v.Tag != asn1.TagPrintableString && v.Tag != asn1.TagUTF8String) {
			return "", deny(ReasonSubject, "a subject value of tag %d, not PrintableString or UTF8String", v.Tag)
		}
		switch {
		case oid.Equal(oidCommonName):
			values["CN"] = append(values["CN"], string(v.Bytes))
		case oid.Equal(oidOrganization):
			values["O"] = append(values["O"], string(v.Bytes))
		default:
			values["other"] = append(values["other"], oid.String())
		}
	}
	if !slices.Equal(values["O"], []string{"system:nodes"}) || len(values["other"]) != 0 {
		return "", deny(ReasonSubject, "the subject's organizations are %s with %d other attributes, want exactly "+
			"[\"system:nodes\"]", quoted(values["O"]), len(values["other"]))
	}
	cn := values["CN"]
	if len(cn) != 1 || !nodeNameRE.MatchString(cn[0]) {
		return "", deny(ReasonSubject, "the common name %s is not system:node:<instance id>", quoted(cn))
	}
	return nodeNameRE.FindStringSubmatch(cn[0])[1], nil
}

// quoted is a list as JSON writes it, the form the messages name values in (a NUL or a quote stays visible).
func quoted[S ~string](list []S) string {
	if list == nil {
		list = []S{}
	}
	b, err := json.Marshal(list)
	if err != nil {
		return fmt.Sprint(list)
	}
	return string(b)
}
