package approve

import (
	"crypto/ecdsa"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode/utf16"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	certificatesv1 "k8s.io/api/certificates/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/dynk8s/dynk8s/internal/fakeaws"
)

// The round-4 security review's crafted CSRs: kubelet client requests built DER by hand, each beside what
// Kubernetes v1.34 does with it (the API server's create validation, the kubelet client signer's recognition, the
// certificate it signs). The crafting below is the review's, with its one key passed in.

func derLen(n int) []byte {
	switch {
	case n < 128:
		return []byte{byte(n)}
	case n < 256:
		return []byte{0x81, byte(n)}
	case n < 65536:
		return []byte{0x82, byte(n >> 8), byte(n)}
	default:
		return []byte{0x83, byte(n >> 16), byte(n >> 8), byte(n)}
	}
}

func cat(parts ...[]byte) []byte {
	var b []byte
	for _, p := range parts {
		b = append(b, p...)
	}
	return b
}

func tlv(tag byte, parts ...[]byte) []byte {
	c := cat(parts...)
	return cat([]byte{tag}, derLen(len(c)), c)
}

// tlvL is a TLV with the length octets given (non-minimal, indefinite).
func tlvL(tag byte, l []byte, parts ...[]byte) []byte { return cat([]byte{tag}, l, cat(parts...)) }

func seq(p ...[]byte) []byte { return tlv(0x30, p...) }
func set(p ...[]byte) []byte { return tlv(0x31, p...) }

var (
	derCN      = []byte{0x06, 0x03, 0x55, 0x04, 0x03}
	derO       = []byte{0x06, 0x03, 0x55, 0x04, 0x0a}
	derOU      = []byte{0x06, 0x03, 0x55, 0x04, 0x0b}
	algECDSA   = seq([]byte{0x06, 0x08, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x04, 0x03, 0x02}) // ecdsa-with-SHA256
	version0   = []byte{0x02, 0x01, 0x00}
	noAttrs    = []byte{0xa0, 0x00}
	cp1, cpPod = "cp-1", "i-0c00000000000000c" // the control plane; a running pool node: both have Nodes
)

func utf8s(s string) []byte    { return tlv(0x0c, []byte(s)) }
func prs(s string) []byte      { return tlv(0x13, []byte(s)) }
func atv(oid, v []byte) []byte { return seq(oid, v) }

func bmp(s string) []byte {
	var b []byte
	for _, u := range utf16.Encode([]rune(s)) {
		b = append(b, byte(u>>8), byte(u))
	}
	return tlv(0x1e, b)
}

func universal(s string) []byte {
	var b []byte
	for _, r := range s {
		b = append(b, 0, 0, 0, byte(r))
	}
	return tlv(0x1c, b)
}

// crafter crafts with one key, as the review's did: every crafted request's key is the one the instances marked,
// so that the key binding is not what denies them.
type crafter struct {
	t   *testing.T
	key *ecdsa.PrivateKey
}

func (c crafter) spki() []byte {
	b, err := x509.MarshalPKIXPublicKey(&c.key.PublicKey)
	assert.NilError(c.t, err)
	return b
}

func (c crafter) cri(subject []byte, more ...[]byte) []byte {
	return seq(cat(version0, subject, c.spki(), noAttrs), cat(more...))
}

// signed wraps a CertificationRequestInfo into a request signed with the key, optionally with extra elements.
func (c crafter) signed(info []byte, extra ...[]byte) []byte {
	h := sha256.Sum256(info)
	sig, err := ecdsa.SignASN1(rand.Reader, c.key, h[:])
	assert.NilError(c.t, err)
	return seq(info, algECDSA, tlv(0x03, []byte{0}, sig), cat(extra...))
}

func pemOf(der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der})
}

// nodesSubject is O=system:nodes, CN=system:node:<name>, each in its own RDN, as client-go writes it.
func nodesSubject(name string) []byte {
	return seq(set(atv(derO, prs("system:nodes"))), set(atv(derCN, utf8s("system:node:"+name))))
}

// smuggle is base64(X) then the PEM block of y: pem.Decode reads only the block, y; a reader of every line not
// starting with ----- reads X||y, which X makes one SEQUENCE {CRI for the live instance, filler, OCTET STRING {y}}.
func smuggle(t *testing.T, liveCRI, y []byte, malformedFirst bool) []byte {
	for pad := range 3 {
		filler := tlv(0x04, make([]byte, pad))
		body := cat(liveCRI, filler, []byte{0x04}, derLen(len(y)))
		x := cat([]byte{0x30}, derLen(len(body)+len(y)), body)
		if len(x)%3 != 0 {
			continue
		}
		xb64 := base64.StdEncoding.EncodeToString(x)
		var lines []string
		for len(xb64) > 64 {
			lines = append(lines, xb64[:64])
			xb64 = xb64[64:]
		}
		lines = append(lines, xb64)
		if malformedFirst {
			// a first block pem.Decode gives up on (its END names another type), so it reads the next one.
			return []byte("-----BEGIN CERTIFICATE REQUEST-----\n" + strings.Join(lines, "\n") +
				"\n-----END JUNK-----\n" + string(pemOf(y)))
		}
		return []byte(strings.Join(lines, "\n") + "\n" + string(pemOf(y)))
	}
	t.Fatal("no filler aligns X")
	return nil
}

// craftedCase is one crafted request: the live instance it names to the loop (node), the loop's decision (reason),
// and Kubernetes' view as the review recorded it: refused at create, or the user Go reads (the CN the signer
// copies; for the cases the signer marks Failed, the CN it reads before refusing).
type craftedCase struct {
	name    string
	node    string
	request []byte
	reason  Reason // ReasonLiveInstance: approved
	refused bool   // the API server refuses it at create (pem.Decode + ParseCertificateRequest + CheckSignature)
	kubeCN  string // else the CN Go reads, "" for the live node's own name
}

func craftedCases(t *testing.T, key *ecdsa.PrivateKey) []craftedCase {
	c := crafter{t: t, key: key}
	n := 0
	id := func() string { n++; return fmt.Sprintf("i-0%016x", 0xa000+n) }
	var cases []craftedCase
	add := func(name, node string, request []byte, reason Reason, refused bool, kubeCN string) {
		cases = append(cases, craftedCase{name, node, request, reason, refused, kubeCN})
	}
	std := func(name string, reason Reason, refused bool, kubeCN string, subject func(live string) []byte) {
		live := id()
		add(name, live, pemOf(c.signed(c.cri(subject(live)))), reason, refused, kubeCN)
	}

	std("baseline", ReasonLiveInstance, false, "", nodesSubject)
	std("cn-first-rdn", ReasonLiveInstance, false, "", func(l string) []byte {
		return seq(set(atv(derCN, utf8s("system:node:"+l))), set(atv(derO, prs("system:nodes"))))
	})
	std("multi-valued-rdn", ReasonSubject, false, "", func(l string) []byte {
		return seq(set(atv(derO, prs("system:nodes")), atv(derCN, utf8s("system:node:"+l))))
	})
	std("two-cn-live-last", ReasonSubject, false, "", func(l string) []byte {
		return seq(set(atv(derO, prs("system:nodes"))), set(atv(derCN, utf8s("system:node:"+cp1))),
			set(atv(derCN, utf8s("system:node:"+l))))
	})
	std("two-cn-cp-last", ReasonSubject, false, "system:node:"+cp1, func(l string) []byte {
		return seq(set(atv(derO, prs("system:nodes"))), set(atv(derCN, utf8s("system:node:"+l))),
			set(atv(derCN, utf8s("system:node:"+cp1))))
	})
	std("two-cn-one-set", ReasonSubject, false, "system:node:"+cp1, func(l string) []byte {
		return seq(set(atv(derO, prs("system:nodes"))), set(atv(derCN, utf8s("system:node:"+l)),
			atv(derCN, utf8s("system:node:"+cp1))))
	})
	std("o-masters-added", ReasonSubject, false, "", func(l string) []byte {
		return seq(set(atv(derO, prs("system:nodes"))), set(atv(derO, prs("system:masters"))),
			set(atv(derCN, utf8s("system:node:"+l))))
	})
	std("o-masters-same-set", ReasonSubject, false, "", func(l string) []byte {
		return seq(set(atv(derO, prs("system:nodes")), atv(derO, prs("system:masters"))),
			set(atv(derCN, utf8s("system:node:"+l))))
	})
	std("ou-masters", ReasonSubject, false, "", func(l string) []byte {
		return seq(set(atv(derO, prs("system:nodes"))), set(atv(derOU, prs("system:masters"))),
			set(atv(derCN, utf8s("system:node:"+l))))
	})
	std("len-0x81-short", ReasonPKCS10, true, "", func(l string) []byte {
		inner := cat(set(atv(derO, prs("system:nodes"))), set(atv(derCN, utf8s("system:node:"+l))))
		return tlvL(0x30, []byte{0x81, byte(len(inner))}, inner)
	})
	std("len-0x82-leading-zero", ReasonPKCS10, true, "", func(l string) []byte {
		inner := cat(set(atv(derO, prs("system:nodes"))), set(atv(derCN, utf8s("system:node:"+l))))
		return tlvL(0x30, []byte{0x82, 0x00, byte(len(inner))}, inner)
	})
	std("len-indefinite", ReasonPKCS10, true, "", func(l string) []byte {
		inner := cat(set(atv(derO, prs("system:nodes"))), set(atv(derCN, utf8s("system:node:"+l))))
		return tlvL(0x30, []byte{0x80}, inner, []byte{0, 0})
	})
	std("cn-t61", ReasonSubject, false, "", func(l string) []byte {
		return seq(set(atv(derO, prs("system:nodes"))), set(atv(derCN, tlv(0x14, []byte("system:node:"+l)))))
	})
	std("cn-utf8-ascii", ReasonLiveInstance, false, "", func(l string) []byte {
		return seq(set(atv(derO, utf8s("system:nodes"))), set(atv(derCN, utf8s("system:node:"+l))))
	})
	std("cn-bmp", ReasonSubject, false, "", func(l string) []byte {
		return seq(set(atv(derO, prs("system:nodes"))), set(atv(derCN, bmp("system:node:"+l))))
	})
	std("cn-universal", ReasonSubject, false, "-", func(l string) []byte {
		return seq(set(atv(derO, prs("system:nodes"))), set(atv(derCN, universal("system:node:"+l))))
	})
	std("cn-ia5", ReasonSubject, false, "", func(l string) []byte {
		return seq(set(atv(derO, prs("system:nodes"))), set(atv(derCN, tlv(0x16, []byte("system:node:"+l)))))
	})
	std("cn-utf8-nul", ReasonSubject, false, "-", func(l string) []byte {
		return seq(set(atv(derO, prs("system:nodes"))), set(atv(derCN, utf8s("system:node:"+l+"\x00cp-1"))))
	})
	std("cn-oid-non-minimal", ReasonPKCS10, true, "", func(l string) []byte {
		return seq(set(atv(derO, prs("system:nodes"))),
			set(atv([]byte{0x06, 0x04, 0x55, 0x80, 0x04, 0x03}, utf8s("system:node:"+l))))
	})
	std("o-oid-non-minimal-masters", ReasonPKCS10, true, "", func(l string) []byte {
		return seq(set(atv(derO, prs("system:nodes"))),
			set(atv([]byte{0x06, 0x04, 0x55, 0x80, 0x04, 0x0a}, prs("system:masters"))),
			set(atv(derCN, utf8s("system:node:"+l))))
	})
	std("cn-high-tag-value", ReasonPKCS10, true, "", func(string) []byte {
		return seq(set(atv(derO, prs("system:nodes"))), set(atv(derCN, tlv(0x1f, []byte{0x0c}, []byte("x")))))
	})
	std("atv-three-parts", ReasonSubject, false, "", func(l string) []byte {
		return seq(set(atv(derO, prs("system:nodes"))), set(seq(derCN, utf8s("system:node:"+l), utf8s("x"))))
	})
	std("empty-rdn", ReasonSubject, false, "", func(l string) []byte {
		return seq(set(), set(atv(derO, prs("system:nodes"))), set(atv(derCN, utf8s("system:node:"+l))))
	})

	// The outer structure.
	live := id()
	add("extra-element-in-cri", live, pemOf(c.signed(c.cri(nodesSubject(live), []byte{0x05, 0x00}))),
		ReasonPKCS10, false, "")
	live = id()
	add("extra-element-in-csr", live, pemOf(c.signed(c.cri(nodesSubject(live)), []byte{0x05, 0x00})),
		ReasonPKCS10, false, "")
	live = id()
	add("csr-over-65535-bytes", live, pemOf(c.signed(c.cri(nodesSubject(live)), tlv(0x04, make([]byte, 70000)))),
		ReasonRequest, false, "")
	live = id()
	add("trailing-byte-after-csr", live, pemOf(cat(c.signed(c.cri(nodesSubject(live))), []byte{0})),
		ReasonPKCS10, true, "")
	live = id()
	add("version-1", live, pemOf(c.signed(seq(cat([]byte{0x02, 0x01, 0x01}, nodesSubject(live), c.spki(),
		noAttrs)))), ReasonPKCS10, false, "")

	// Attributes and extensions.
	live = id()
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: pkix.Name{
		CommonName: "system:node:" + live, Organization: []string{"system:nodes"}}, DNSNames: []string{cp1}}, key)
	assert.NilError(t, err)
	add("san-extension", live, pemOf(der), ReasonExtension, false, "")
	live = id()
	der, err = x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: pkix.Name{
		CommonName: "system:node:" + live, Organization: []string{"system:nodes"}},
		ExtraExtensions: []pkix.Extension{{Id: []int{2, 5, 29, 9}, Value: nodesSubject(cp1)}}}, key)
	assert.NilError(t, err)
	add("subject-in-extension", live, pemOf(der), ReasonExtension, false, "")

	// The signature and the key.
	live = id()
	der = c.signed(c.cri(nodesSubject(live)))
	der[len(der)-3] ^= 0xff
	add("bad-signature", live, pemOf(der), ReasonSignature, true, "")
	live = id()
	badKey := seq(seq([]byte{0x06, 0x07, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01},
		[]byte{0x06, 0x08, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07}), tlv(0x03, []byte{0, 4, 1, 2, 3}))
	add("bad-public-key", live, pemOf(c.signed(seq(cat(version0, nodesSubject(live), badKey, noAttrs)))),
		ReasonPKCS10, true, "")
	live = id()
	junkKey := seq(seq([]byte{0x06, 0x03, 0x2a, 0x03, 0x04}), tlv(0x03, []byte{0, 1}))
	add("unknown-key-algorithm", live, pemOf(c.signed(seq(cat(version0, nodesSubject(live), junkKey, noAttrs)))),
		ReasonSignature, true, "")

	// The PEM layer: text around the block that a reader of the whole text takes for the request.
	for _, target := range []string{cp1, cpPod} {
		live := id()
		liveCRI := seq(cat(version0, nodesSubject(live), seq(seq([]byte{0x05, 0x00})), noAttrs))
		y := c.signed(c.cri(nodesSubject(target)))
		add("pem-leading-text->"+target, live, smuggle(t, liveCRI, y, false), ReasonRequest, false,
			"system:node:"+target)
		live = id()
		liveCRI = seq(cat(version0, nodesSubject(live), seq(seq([]byte{0x05, 0x00})), noAttrs))
		add("pem-malformed-first-block->"+target, live, smuggle(t, liveCRI, y, true), ReasonRequest, false,
			"system:node:"+target)
	}
	live = id()
	liveCRI := seq(cat(version0, nodesSubject(live), seq(seq([]byte{0x05, 0x00})), noAttrs))
	y := c.signed(c.cri(seq(set(atv(derO, prs("system:masters"))), set(atv(derCN, utf8s("system:node:"+cp1))))))
	add("pem-leading-text->O=system:masters", live, smuggle(t, liveCRI, y, false), ReasonRequest, false,
		"system:node:"+cp1)
	return cases
}

// TestCraftedCSRs runs the round-4 security review's 38 crafted CSRs through the loop, every named instance live
// and marked with the crafting key: each gets the decision its row says, Kubernetes' view of its request is the one
// the review recorded (refused at create, or the user Go reads), and every approved CSR is one the signer issues
// for exactly the approved instance: its spec.request, read as the API server reads it, has a valid signature,
// CN=system:node:<instance> and O=[system:nodes].
func TestCraftedCSRs(t *testing.T) {
	key := newKey(t)
	mark := keyMark(t, key)
	cases := craftedCases(t, key)
	assert.Equal(t, len(cases), 38)
	when := time.Date(2026, 3, 1, 11, 0, 0, 0, time.UTC)
	objs := []runtime.Object{node(cp1), node(cpPod)}
	instances := []fakeaws.EC2Instance{instance(cpPod, "builders-x86", mark)}
	for i, cc := range cases {
		objs = append(objs, kubeletCSR(fmt.Sprintf("c%02d", i), cc.request, when.Add(time.Duration(i)*time.Second)))
		instances = append(instances, instance(cc.node, "builders-x86", mark))
	}
	r := newRig(t, instances, objs...)
	r.start(t)
	var all []string
	for i := range cases {
		all = append(all, fmt.Sprintf("c%02d", i))
	}
	r.decided(t, all...)

	approved := 0
	for i, cc := range cases {
		c := r.condition(t, fmt.Sprintf("c%02d", i))
		cr, kerr := readBack(cc.request)
		// Kubernetes' view, as the review recorded it.
		if cc.refused {
			assert.Check(t, kerr != nil, "%s: the API server would take it", cc.name)
		} else if assert.Check(t, kerr, cc.name) && cc.kubeCN != "-" {
			want := cc.kubeCN
			if want == "" {
				want = "system:node:" + cc.node
			}
			assert.Check(t, is.Equal(cr.Subject.CommonName, want), cc.name)
		}
		if cc.reason != ReasonLiveInstance {
			assert.Check(t, is.Equal(c.Type, certificatesv1.CertificateDenied), "%s: %s", cc.name, c.Message)
			continue
		}
		approved++
		if !assert.Check(t, is.Equal(c.Type, certificatesv1.CertificateApproved), "%s: %s", cc.name, c.Message) {
			continue
		}
		assert.Check(t, strings.HasSuffix(c.Message, " node "+cc.node), cc.name)
		assert.Assert(t, kerr, cc.name)
		assert.Check(t, is.Equal(cr.Subject.CommonName, "system:node:"+cc.node), cc.name)
		assert.Check(t, is.DeepEqual(cr.Subject.Organization, []string{"system:nodes"}), cc.name)
	}
	assert.Check(t, is.Equal(approved, 3))
	// The reason code of each denial is its row's.
	for i, cc := range cases {
		claim, err := Read(kubeletCSR("x", cc.request, when), testGroup)
		if cc.reason == ReasonLiveInstance {
			assert.Check(t, err, cc.name)
			assert.Check(t, is.Equal(claim.Node, cc.node), cc.name)
			continue
		}
		var d *Denial
		if assert.Check(t, errors.As(err, &d), "%s: %v", cc.name, err) {
			assert.Check(t, is.Equal(d.Reason, cc.reason), "%s (c%02d): %s", cc.name, i, d.Message)
			assert.Check(t, slices.Contains([]string{r.condition(t, fmt.Sprintf("c%02d", i)).Message},
				"dynk8s-controller: "+d.Message), cc.name)
		}
	}
}
