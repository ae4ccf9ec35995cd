// Package csrtest makes kubelet client certificate requests for the CSR approver's tests: the requests a kubelet
// makes, and requests that are not exactly one PEM block, which the API server still accepts and signs by their
// first block. The unit tests (infra/addons) and the real API server's (e2e) take the same requests from here.
package csrtest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"encoding/base64"
	"encoding/pem"
	"strings"
	"testing"
)

// KubeletSubject is the subject a kubelet's client certificate request has: O=system:nodes, CN=system:node:<node>.
func KubeletSubject(node string) pkix.Name {
	return pkix.Name{CommonName: "system:node:" + node, Organization: []string{"system:nodes"}}
}

// Signed is a DER certificate request for subject, made by Go's x509 as a kubelet's client-go makes it (an ECDSA
// P-256 key, no extensions).
func Signed(t testing.TB, subject pkix.Name) []byte {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: subject}, key)
	if err != nil {
		t.Fatal(err)
	}
	return der
}

// Block is der as one CERTIFICATE REQUEST PEM block, as pem.EncodeToMemory writes it.
func Block(der []byte) string {
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}))
}

// Smuggled are request texts (PEM, before the base64 of a CSR's spec.request) that are not exactly one CERTIFICATE
// REQUEST block, keyed by case name, each checked to be, as pem.Decode reads it, one validly signed request. The API
// server and the kubelet client signer read a request with pem.Decode (kubernetes pkg/apis/certificates ParseCSR),
// which takes the first well-formed block and skips any text around it, so an approver that reads the whole text
// must refuse all of them:
//   - "text-before" and "malformed-first-block": the text around the block is X, the front of one DER SEQUENCE
//     {CertificationRequestInfo for liveA, OCTET STRING filler, OCTET STRING header} whose lengths cover the block's
//     bytes. A reader that base64-decodes every line not starting with ----- reads X followed by the block as one
//     request for liveA, while the API server signs the block, a real request for target.
//   - "two-blocks": a block for liveB, then one for target (pem.Decode reads liveB's);
//   - "text-after" and "headers": a block for liveB inside text pem.Decode ignores, or with PEM headers.
func Smuggled(t testing.TB, liveA, liveB, target string) map[string]string {
	t.Helper()
	y := Signed(t, KubeletSubject(target))
	x := smugglingFront(t, liveA, y)
	b64 := base64.StdEncoding.EncodeToString
	texts := map[string]string{
		"text-before":           b64(x) + "\n" + Block(y),
		"malformed-first-block": "-----BEGIN CERTIFICATE REQUEST-----\n" + b64(x) + "\n-----END X-----\n" + Block(y),
		"two-blocks":            Block(Signed(t, KubeletSubject(liveB))) + Block(y),
		"text-after":            Block(Signed(t, KubeletSubject(liveB))) + "trailing text\n",
		"headers": strings.Replace(Block(Signed(t, KubeletSubject(liveB))), "-----\n",
			"-----\nProc-Type: 4,ENCRYPTED\n\n", 1),
	}
	reads := map[string]string{"text-before": target, "malformed-first-block": target, "two-blocks": liveB,
		"text-after": liveB, "headers": liveB}
	for name, text := range texts {
		p, _ := pem.Decode([]byte(text))
		if p == nil {
			t.Fatalf("%s: pem.Decode finds no block", name)
		}
		cr, err := x509.ParseCertificateRequest(p.Bytes)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if err := cr.CheckSignature(); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if want := "system:node:" + reads[name]; cr.Subject.CommonName != want {
			t.Fatalf("%s: pem.Decode reads a request for %s, want %s", name, cr.Subject.CommonName, want)
		}
	}
	return texts
}

// smugglingFront is X for Smuggled: DER bytes, a whole number of base64 quanta long, that a reader of X followed by
// y takes for one request for live.
func smugglingFront(t testing.TB, live string, y []byte) []byte {
	t.Helper()
	subject, err := asn1.Marshal(KubeletSubject(live).ToRDNSequence())
	if err != nil {
		t.Fatal(err)
	}
	// version 0, the subject, an empty key (SEQUENCE {SEQUENCE {NULL}}), no attributes.
	info, err := asn1.Marshal(asn1.RawValue{Tag: asn1.TagSequence, IsCompound: true,
		Bytes: append(append([]byte{2, 1, 0}, subject...), 0x30, 0x04, 0x30, 0x02, 0x05, 0x00, 0xa0, 0x00)})
	if err != nil {
		t.Fatal(err)
	}
	wrapped, err := asn1.Marshal(y) // OCTET STRING {y}: its header is what X ends with
	if err != nil {
		t.Fatal(err)
	}
	for pad := range 3 {
		filler, err := asn1.Marshal(make([]byte, pad))
		if err != nil {
			t.Fatal(err)
		}
		body := append(append(append([]byte{}, info...), filler...), wrapped[:len(wrapped)-len(y)]...)
		outer, err := asn1.Marshal(asn1.RawValue{Tag: asn1.TagSequence, IsCompound: true, Bytes: append(body, y...)})
		if err != nil {
			t.Fatal(err)
		}
		if front := outer[:len(outer)-len(y)]; len(front)%3 == 0 {
			return front
		}
	}
	t.Fatal("no filler makes X a whole number of base64 quanta")
	return nil
}
