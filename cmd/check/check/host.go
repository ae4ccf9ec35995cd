package check

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
)

// LinuxHost is this host's network as Linux shows it: routes by `ip -json route get` (iproute2, which wg-quick
// needs too), interfaces' MTUs from /sys/class/net.
type LinuxHost struct {
	// SysClassNet is /sys/class/net (tests point it elsewhere).
	SysClassNet string
}

// RouteTo asks the kernel which route it takes to addr.
func (h LinuxHost) RouteTo(ctx context.Context, addr netip.Addr) (Route, error) {
	out, err := exec.CommandContext(ctx, "ip", "-json", "route", "get", addr.String()).Output()
	if err != nil {
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			return Route{}, fmt.Errorf("ip route get %s: %s", addr, strings.TrimSpace(string(exit.Stderr)))
		}
		return Route{}, fmt.Errorf("ip route get %s: %w", addr, err)
	}
	rt, err := parseRouteGet(out)
	if err != nil {
		return Route{}, fmt.Errorf("ip route get %s: %w", addr, err)
	}
	return rt, nil
}

// parseRouteGet reads `ip -json route get`'s answer: a list of one route.
func parseRouteGet(out []byte) (Route, error) {
	var routes []struct {
		Dev     string `json:"dev"`
		Gateway string `json:"gateway"`
	}
	if err := json.Unmarshal(out, &routes); err != nil || len(routes) == 0 || routes[0].Dev == "" {
		return Route{}, fmt.Errorf("unexpected answer %q", out)
	}
	return Route{Dev: routes[0].Dev, Via: routes[0].Gateway}, nil
}

// MTU reads /sys/class/net/<name>/mtu.
func (h LinuxHost) MTU(name string) (int, bool, error) {
	if strings.ContainsAny(name, "/") || name == "" || name == "." || name == ".." {
		return 0, false, fmt.Errorf("not an interface name: %q", name)
	}
	b, err := os.ReadFile(filepath.Join(h.SysClassNet, name, "mtu"))
	if errors.Is(err, os.ErrNotExist) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, err
	}
	mtu, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return 0, false, fmt.Errorf("%s: %w", name, err)
	}
	return mtu, true, nil
}
