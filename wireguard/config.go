package wireguard

import (
	"bytes"
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"

	"github.com/dynk8s/dynk8s/internal/endpoint"
)

// MTU bounds, which the config holds the tunnel to: below 1280 IPv6 cannot run over the tunnel; 8920 is a
// 9001-byte jumbo frame (the EC2 maximum) less WireGuard's 80-byte worst-case (IPv6) overhead.
const (
	MinMTU = 1280
	MaxMTU = 8920
)

// Interface is the [Interface] section of a wg-quick(8) file. Zero values are omitted from the output. The values
// are typed, so Marshal checks only what the file's encoding needs; the rules about them (the MTU's range, which
// ranges may be routed) are the caller's.
type Interface struct {
	// PrivateKey may be nil only when a PostUp hook loads the key from a file (`wg set %i private-key FILE`), which
	// keeps the key itself out of the rendered file.
	PrivateKey *wgtypes.Key
	// Address lists the interface's addresses, each a host address with its prefix length (10.8.0.1/24).
	Address []netip.Prefix
	// ListenPort is the UDP port to listen on; 0 lets the kernel pick one (fine for a peer that only dials out).
	ListenPort uint16
	// MTU is the tunnel MTU; 0 lets wg-quick derive it from the route to the endpoint.
	MTU uint16
	// Table is wg-quick's routing table: "off", "auto", or a table number or name; empty means "auto".
	Table string
	// PreUp, PostUp, PreDown and PostDown are shell commands, run in order. Each becomes its own line, because a
	// command may itself contain ", " and wg-quick runs repeated hook keys one after another.
	PreUp, PostUp, PreDown, PostDown []string
}

// Peer is one [Peer] section.
type Peer struct {
	// PublicKey is required.
	PublicKey wgtypes.Key
	// PresharedKey is optional, adding a symmetric layer to the handshake.
	PresharedKey *wgtypes.Key
	// AllowedIPs lists the networks routed to and accepted from this peer, each a network address.
	AllowedIPs []netip.Prefix
	// Endpoint is optional; a peer without one only answers.
	Endpoint *endpoint.HostPort
	// PersistentKeepalive in seconds (0 = off); 25 keeps a NAT mapping open for a peer behind NAT.
	PersistentKeepalive uint16
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
	if in.PrivateKey == nil && !loadsKeyFromFile(in.PostUp) {
		add("Interface.PrivateKey", errors.New("required (or load it in PostUp with `wg set %i private-key FILE`)"))
	}
	for i, a := range in.Address {
		if !a.IsValid() {
			add(fmt.Sprintf("Interface.Address[%d]", i), errors.New("is not an address with a prefix length"))
		}
	}
	add("Interface.Table", validateTable(in.Table))
	for _, h := range in.hooks() {
		for i, cmd := range h.cmds {
			add(fmt.Sprintf("Interface.%s[%d]", h.key, i), validateCommand(cmd))
		}
	}

	seen := map[wgtypes.Key]int{}
	for i, p := range c.Peers {
		path := fmt.Sprintf("Peers[%d]", i)
		if p.PublicKey == (wgtypes.Key{}) {
			add(path+".PublicKey", errors.New("required"))
		} else if j, dup := seen[p.PublicKey]; dup {
			// wg(8) would silently merge the two sections into one peer.
			add(path+".PublicKey", fmt.Errorf("same key as Peers[%d]", j))
		} else {
			seen[p.PublicKey] = i
		}
		for j, a := range p.AllowedIPs {
			add(fmt.Sprintf("%s.AllowedIPs[%d]", path, j), validateCIDR(a))
		}
		if p.Endpoint != nil && p.Endpoint.IsZero() {
			add(path+".Endpoint", errors.New("is empty: leave it nil for a peer that only answers"))
		}
	}
	return errors.Join(errs...)
}

func (in Interface) section() section {
	s := section{name: "Interface"}
	if in.PrivateKey != nil {
		s.add("PrivateKey", in.PrivateKey.String())
	}
	s.add("Address", joinPrefixes(in.Address))
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
	s.add("PublicKey", p.PublicKey.String())
	if p.PresharedKey != nil {
		s.add("PresharedKey", p.PresharedKey.String())
	}
	s.add("AllowedIPs", joinPrefixes(p.AllowedIPs))
	if p.Endpoint != nil {
		s.add("Endpoint", p.Endpoint.String())
	}
	s.addInt("PersistentKeepalive", p.PersistentKeepalive)
	return s
}

func joinPrefixes(ps []netip.Prefix) string {
	s := make([]string, len(ps))
	for i, p := range ps {
		s[i] = p.String()
	}
	return strings.Join(s, ", ")
}

func (s *section) add(key, value string) {
	if value != "" {
		s.fields = append(s.fields, field{key, value})
	}
}

func (s *section) addInt(key string, v uint16) {
	if v != 0 {
		s.add(key, strconv.Itoa(int(v)))
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

// validateCIDR requires a network address: wg(8) would silently mask 10.0.0.1/16 to 10.0.0.0/16, which almost
// always means the author confused an address with a network.
func validateCIDR(p netip.Prefix) error {
	if !p.IsValid() {
		return errors.New("is not a CIDR")
	}
	if p.Masked() != p {
		return fmt.Errorf("%s has host bits set, want %s", p, p.Masked())
	}
	return nil
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
