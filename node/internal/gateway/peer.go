package gateway

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"

	"golang.zx2c4.com/wireguard/wgctrl"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"

	"github.com/dynk8s/dynk8s/node/internal/cli"
	"github.com/dynk8s/dynk8s/node/internal/system"
	"github.com/dynk8s/dynk8s/node/nodeconfig"
)

// The on-prem peer's address across the gateway's stops, when on-prem dials in (wireguard.onPremEndpoint unset).
//
// Then only the on-prem peer knows where to send a handshake, and after the gateway slept it sends one late: it
// still holds the session of before the stop and sends its keepalives in it, which the restarted gateway drops
// without an answer; it starts a new handshake only when that session is two minutes old (WireGuard's
// REKEY_AFTER_TIME, for the side that initiated it) or 15 s after data it sent went unanswered (KEEPALIVE_TIMEOUT plus
// REKEY_TIMEOUT); wireguard-go device/timers.go and send.go, the kernel's drivers/net/wireguard/timers.c. In the box
// the tunnel came up 50 and 91 s after the gateway's second start, 7-12 s after its first.
//
// So the gateway keeps the address it last heard the peer from: SavePeer, run by wg-quick@wg0's stop before
// `wg-quick down` deletes wg0, writes it under /var/lib/dynk8s (the root volume, which a stop keeps); DialPeer, run
// once `wg-quick up` has brought wg0 up with its key, gives it back to the peer with a persistent keepalive, and
// WireGuard sends a keepalive, and with it a handshake initiation, at once (wg(8), persistent-keepalive: the rule the
// dial-out gateway's PostUp uses). The peer answers it as any initiation. While the gateway sleeps, the on-prem peer
// keeps sending to the gateway's Elastic IP from that address (every 5 s while it retries a handshake, at least every
// 25 s), so a NAT in front of it keeps the mapping; where the address has moved all the same, the initiation is lost
// and the peer's own handshake brings the tunnel up, as before. The gateway keeps its keepalive then, as the dial-out
// gateway does: 32 bytes every 25 s on an idle tunnel.
var (
	SavePeer = peerCommand((*peerRun).save)
	DialPeer = peerCommand((*peerRun).dial)
)

// peerFile is where SavePeer keeps the on-prem peer's address, under /var/lib/dynk8s.
const peerFile = "onprem-peer"

// peerRun is one run of a peer command: the interface wg-quick names (%i), and the device's WireGuard.
type peerRun struct {
	iface  string
	path   string
	wg     *wgctrl.Client
	log    *system.Logger
	dryRun bool
}

// peerCommand runs step on the interface --interface names. Neither command fails the tunnel's unit over what it
// cannot do (the tunnel comes up without it, as before it): each logs why and exits 0.
func peerCommand(step func(*peerRun) error) func(context.Context, *cli.Env) error {
	return func(_ context.Context, env *cli.Env) error {
		iface := env.String("interface")
		if iface == "" {
			return cli.UsageError("--interface is required (wg-quick's %i)")
		}
		wg, err := wgctrl.New()
		if err != nil {
			env.Log.Printf("the on-prem peer's address is not kept: WireGuard's control: %v", err)
			return nil
		}
		defer func() { _ = wg.Close() }()
		r := &peerRun{iface: iface, path: env.Files.State(peerFile), wg: wg, log: env.Log, dryRun: env.DryRun}
		if err := step(r); err != nil {
			env.Log.Printf("%v; the on-prem peer's own handshake brings the tunnel up", err)
		}
		return nil
	}
}

// save writes the address the on-prem peer was last heard from, if the tunnel heard it this boot.
func (r *peerRun) save() error {
	dev, err := r.wg.Device(r.iface)
	if err != nil {
		return fmt.Errorf("the on-prem peer's address is not saved: %w", err)
	}
	addr, err := peerAddress(dev)
	if err != nil {
		return fmt.Errorf("the on-prem peer's address is not saved: %w", err)
	}
	if !addr.IsValid() {
		r.log.Printf("%s heard no on-prem peer this boot: %s keeps what it had", r.iface, r.path)
		return nil
	}
	if r.dryRun {
		r.log.Printf("dry run: would save the on-prem peer's address %s to %s", addr, r.path)
		return nil
	}
	if err := system.WriteFileAtomic(r.path, []byte(addr.String()+"\n"), 0o644); err != nil {
		return fmt.Errorf("the on-prem peer's address is not saved: %w", err)
	}
	r.log.Printf("saved the on-prem peer's address %s to %s, for the next start to dial", addr, r.path)
	return nil
}

// dial gives the on-prem peer the address it was last heard from, with a persistent keepalive, so that the gateway
// sends a handshake initiation there now.
func (r *peerRun) dial() error {
	b, err := os.ReadFile(r.path)
	if errors.Is(err, os.ErrNotExist) {
		r.log.Printf("no saved address of the on-prem peer (%s): its own handshake brings the tunnel up", r.path)
		return nil
	}
	if err != nil {
		return fmt.Errorf("the on-prem peer is not dialled: %w", err)
	}
	addr, err := netip.ParseAddrPort(strings.TrimSpace(string(b)))
	if err != nil {
		return fmt.Errorf("the on-prem peer is not dialled: %s: %w", r.path, err)
	}
	dev, err := r.wg.Device(r.iface)
	if err != nil {
		return fmt.Errorf("the on-prem peer is not dialled: %w", err)
	}
	cfg, err := dialConfig(dev, addr)
	if err != nil {
		return fmt.Errorf("the on-prem peer is not dialled: %w", err)
	}
	if r.dryRun {
		r.log.Printf("dry run: would dial the on-prem peer at %s from %s", addr, r.iface)
		return nil
	}
	if err := r.wg.ConfigureDevice(r.iface, cfg); err != nil {
		return fmt.Errorf("the on-prem peer is not dialled: %s: %w", r.iface, err)
	}
	r.log.Printf("dialled the on-prem peer at %s, where it was last heard from (%s): a handshake initiation leaves now",
		addr, r.path)
	return nil
}

// onlyPeer is the device's one peer: the gateway's wg0 has the on-prem peer alone.
func onlyPeer(dev *wgtypes.Device) (wgtypes.Peer, error) {
	if len(dev.Peers) != 1 {
		return wgtypes.Peer{}, fmt.Errorf("%s has %d peers, want the on-prem peer alone", dev.Name, len(dev.Peers))
	}
	return dev.Peers[0], nil
}

// peerAddress is the address dev's one peer was last heard from; the zero value if none this boot.
func peerAddress(dev *wgtypes.Device) (netip.AddrPort, error) {
	p, err := onlyPeer(dev)
	if err != nil || p.Endpoint == nil {
		return netip.AddrPort{}, err
	}
	a := p.Endpoint.AddrPort() // an IPv4 address may come in its 16-byte form (net.ParseIP's)
	return netip.AddrPortFrom(a.Addr().Unmap(), a.Port()), nil
}

// dialConfig sets dev's one peer's address to addr with a persistent keepalive, and only that.
func dialConfig(dev *wgtypes.Device, addr netip.AddrPort) (wgtypes.Config, error) {
	p, err := onlyPeer(dev)
	if err != nil {
		return wgtypes.Config{}, err
	}
	keepalive := nodeconfig.GatewayPeerKeepalive
	return wgtypes.Config{Peers: []wgtypes.PeerConfig{{
		PublicKey:                   p.PublicKey,
		UpdateOnly:                  true,
		Endpoint:                    net.UDPAddrFromAddrPort(addr),
		PersistentKeepaliveInterval: &keepalive,
	}}}, nil
}
