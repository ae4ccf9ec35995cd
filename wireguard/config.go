package wireguard

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
)

// MTU bounds: below 1280 IPv6 cannot run over the tunnel; 8920 is a 9001-byte jumbo frame (the EC2 maximum) less
// WireGuard's 80-byte worst-case (IPv6) overhead.
const (
	MinMTU = 1280
	MaxMTU = 8920
)

// Interface is the [Interface] section of a wg-quick(8) file. Zero values are omitted from the output.
type Interface struct {
	// PrivateKey is 32 bytes, standard base64. It may be left empty only when a PostUp hook loads the key from a
	// file (`wg set %i private-key FILE`), which keeps the key itself out of the rendered file.
	PrivateKey string
	// Address lists the interface's addresses, each an IP with an optional prefix length (10.8.0.1/24).
	Address []string
	// ListenPort is the UDP port to listen on; 0 lets the kernel pick one (fine for a peer that only dials out).
	ListenPort int
	// MTU is the tunnel MTU; 0 lets wg-quick derive it from the route to the endpoint.
	MTU int
	// Table is wg-quick's routing table: "off", "auto", or a table number or name; empty means "auto".
	Table string
	// PreUp, PostUp, PreDown and PostDown are shell commands, run in order. Each becomes its own line, because a
	// command may itself contain ", " and wg-quick runs repeated hook keys one after another.
	PreUp, PostUp, PreDown, PostDown []string
}

// Peer is one [Peer] section.
type Peer struct {
	// PublicKey is required: 32 bytes, standard base64.
	PublicKey string
	// PresharedKey is optional: 32 bytes, standard base64, adding a symmetric layer to the handshake.
	PresharedKey string
	// AllowedIPs lists the networks routed to and accepted from this peer, each in canonical CIDR form.
	AllowedIPs []string
	// Endpoint is optional host:port (IPv6 in brackets); a peer without one only answers.
	Endpoint string
	// PersistentKeepalive in seconds (0 = off); 25 keeps a NAT mapping open for a peer behind NAT.
	PersistentKeepalive int
}

// PersistentKeepalive is the keepalive, in seconds, of a peer that must keep a NAT mapping open (wg(8)
// recommends 25 for peers behind NAT).
const PersistentKeepalive = 25

// Config is a whole wg-quick(8) file.
type Config struct {
	Interface Interface
	Peers     []Peer
}

// field is one "Key = value" line; sections keep them in the order wg-quick documents them, so output is stable.
type field struct {
	key, value string
}

type section struct {
	name   string
	fields []field
}

// Marshal renders a wg-quick(8) file: [Interface] then one [Peer] per peer, fields in a fixed order, empty fields
// omitted, list fields joined with ", ". It validates every field first and reports all problems at once, each
// naming its field (for example "Peers[1].Endpoint").
func (c Config) Marshal() ([]byte, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	secs := make([]section, 0, 1+len(c.Peers))
	secs = append(secs, c.Interface.section())
	for _, p := range c.Peers {
		secs = append(secs, p.section())
	}
	return encode(secs), nil
}

// Validate checks the config as Marshal does, without rendering it.
func (c Config) Validate() error {
	var errs []error
	add := func(path string, err error) {
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", path, err))
		}
	}
	in := c.Interface
	if in.PrivateKey == "" {
		if !loadsKeyFromFile(in.PostUp) {
			add("Interface.PrivateKey", errors.New("required (or load it in PostUp with `wg set %i private-key FILE`)"))
		}
	} else {
		add("Interface.PrivateKey", ValidateKey(in.PrivateKey))
	}
	for i, a := range in.Address {
		add(fmt.Sprintf("Interface.Address[%d]", i), validateAddress(a))
	}
	add("Interface.ListenPort", validateRange(in.ListenPort, 0, 65535))
	if in.MTU != 0 {
		add("Interface.MTU", validateRange(in.MTU, MinMTU, MaxMTU))
	}
	add("Interface.Table", validateTable(in.Table))
	for _, h := range in.hooks() {
		for i, cmd := range h.cmds {
			add(fmt.Sprintf("Interface.%s[%d]", h.key, i), validateCommand(cmd))
		}
	}

	seen := map[string]int{}
	for i, p := range c.Peers {
		path := fmt.Sprintf("Peers[%d]", i)
		if p.PublicKey == "" {
			add(path+".PublicKey", errors.New("required"))
		} else if err := ValidateKey(p.PublicKey); err != nil {
			add(path+".PublicKey", err)
		} else if j, dup := seen[p.PublicKey]; dup {
			// wg(8) would silently merge the two sections into one peer.
			add(path+".PublicKey", fmt.Errorf("same key as Peers[%d]", j))
		} else {
			seen[p.PublicKey] = i
		}
		if p.PresharedKey != "" {
			add(path+".PresharedKey", ValidateKey(p.PresharedKey))
		}
		for j, a := range p.AllowedIPs {
			add(fmt.Sprintf("%s.AllowedIPs[%d]", path, j), validateCIDR(a))
		}
		if p.Endpoint != "" {
			add(path+".Endpoint", validateEndpoint(p.Endpoint))
		}
		add(path+".PersistentKeepalive", validateRange(p.PersistentKeepalive, 0, 65535))
	}
	return errors.Join(errs...)
}

func (in Interface) section() section {
	s := section{name: "Interface"}
	s.add("PrivateKey", in.PrivateKey)
	s.add("Address", strings.Join(in.Address, ", "))
	s.addInt("ListenPort", in.ListenPort)
	s.addInt("MTU", in.MTU)
	s.add("Table", in.Table)
	for _, h := range in.hooks() {
		for _, cmd := range h.cmds {
			s.add(h.key, cmd)
		}
	}
	return s
}

type hook struct {
	key  string
	cmds []string
}

// hooks lists the hook keys in wg-quick's run order.
func (in Interface) hooks() []hook {
	return []hook{{"PreUp", in.PreUp}, {"PostUp", in.PostUp}, {"PreDown", in.PreDown}, {"PostDown", in.PostDown}}
}

func (p Peer) section() section {
	s := section{name: "Peer"}
	s.add("PublicKey", p.PublicKey)
	s.add("PresharedKey", p.PresharedKey)
	s.add("AllowedIPs", strings.Join(p.AllowedIPs, ", "))
	s.add("Endpoint", p.Endpoint)
	s.addInt("PersistentKeepalive", p.PersistentKeepalive)
	return s
}

func (s *section) add(key, value string) {
	if value != "" {
		s.fields = append(s.fields, field{key, value})
	}
}

func (s *section) addInt(key string, v int) {
	if v != 0 {
		s.add(key, strconv.Itoa(v))
	}
}

func encode(secs []section) []byte {
	var b bytes.Buffer
	for i, s := range secs {
		if i > 0 {
			b.WriteByte('\n')
		}
		fmt.Fprintf(&b, "[%s]\n", s.name)
		for _, f := range s.fields {
			fmt.Fprintf(&b, "%s = %s\n", f.key, f.value)
		}
	}
	return b.Bytes()
}

func validateRange(v, lo, hi int) error {
	if v < lo || v > hi {
		return fmt.Errorf("%d is out of range %d..%d", v, lo, hi)
	}
	return nil
}

// validateAddress accepts what wg-quick's Address takes: an IP with or without a prefix length. A host address
// inside a prefix (10.8.0.1/24) is the normal form here, so it is not masked.
func validateAddress(s string) error {
	if strings.Contains(s, "/") {
		if _, err := netip.ParsePrefix(s); err != nil {
			return fmt.Errorf("%q is not an IP address or CIDR: %w", s, err)
		}
		return nil
	}
	if _, err := netip.ParseAddr(s); err != nil {
		return fmt.Errorf("%q is not an IP address or CIDR: %w", s, err)
	}
	return nil
}

// validateCIDR requires a canonical network: wg(8) would silently mask 10.0.0.1/16 to 10.0.0.0/16, which almost
// always means the author confused an address with a network.
func validateCIDR(s string) error {
	p, err := netip.ParsePrefix(s)
	if err != nil {
		return fmt.Errorf("%q is not a CIDR: %w", s, err)
	}
	if p.Masked() != p {
		return fmt.Errorf("%q has host bits set, want %s", s, p.Masked())
	}
	return nil
}

func validateEndpoint(s string) error {
	host, port, err := net.SplitHostPort(s)
	if err != nil {
		return fmt.Errorf("%q is not host:port: %w", s, err)
	}
	n, err := strconv.Atoi(port)
	if err != nil || n < 1 || n > 65535 {
		return fmt.Errorf("%q: port %q is not in 1..65535", s, port)
	}
	if _, err := netip.ParseAddr(host); err == nil {
		return nil
	}
	if !isHostname(host) {
		return fmt.Errorf("%q: host %q is neither an IP address nor a DNS name", s, host)
	}
	return nil
}

// isHostname checks RFC 1123 label syntax, enough to refuse spaces, stray colons and injected text.
func isHostname(h string) bool {
	h = strings.TrimSuffix(h, ".")
	if h == "" || len(h) > 253 {
		return false
	}
	for _, label := range strings.Split(h, ".") {
		if label == "" || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' {
			return false
		}
		for _, r := range label {
			if (r < 'a' || r > 'z') && (r < 'A' || r > 'Z') && (r < '0' || r > '9') && r != '-' {
				return false
			}
		}
	}
	return true
}

func validateTable(s string) error {
	if s == "" {
		return nil
	}
	for _, r := range s {
		if (r < 'a' || r > 'z') && (r < 'A' || r > 'Z') && (r < '0' || r > '9') && r != '_' && r != '-' {
			return fmt.Errorf("%q: want off, auto, or a routing table number or name", s)
		}
	}
	return nil
}

// validateCommand refuses line breaks, which would end the value and let the rest be read as new keys.
func validateCommand(s string) error {
	if strings.TrimSpace(s) == "" {
		return errors.New("empty command")
	}
	if strings.ContainsAny(s, "\r\n") {
		return fmt.Errorf("%q contains a line break", s)
	}
	return nil
}

// loadsKeyFromFile reports whether a PostUp hook sets the interface's private key.
func loadsKeyFromFile(postUp []string) bool {
	for _, cmd := range postUp {
		if strings.Contains(cmd, "wg set %i private-key ") {
			return true
		}
	}
	return false
}
