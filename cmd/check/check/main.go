package check

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/netip"
	"text/tabwriter"
	"time"

	"golang.zx2c4.com/wireguard/wgctrl"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/dynk8s/dynk8s/cmd/internal/kubeclient"
	"github.com/dynk8s/dynk8s/infra/config"
)

// Main is cmd/check: it parses args, reads the stack file, runs the checks and prints them. It returns 0 when no
// check failed, 1 when one did (or the stack file is wrong), 2 on bad usage.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("check", flag.ContinueOnError)
	fs.SetOutput(stderr)
	stack := fs.String("stack", "dev", "stack name: reads Pulumi.<stack>.yaml")
	configFile := fs.String("config", "", "stack config file to read instead of Pulumi.<stack>.yaml")
	kubeconfig := fs.String("kubeconfig", "", "kubeconfig of the cluster (default: $KUBECONFIG, else ~/.kube/config)")
	kubeContext := fs.String("context", "", "kubeconfig context (default: the current one)")
	output := fs.String("o", "text", "output: text or json")
	iface := fs.String("wg-interface", "", "the on-prem peer's WireGuard interface (default: the one whose peer "+
		"routes the stack's VPC)")
	peer := fs.String("peer", "", "on a host that is not the on-prem peer: the peer's address, which the VPC's "+
		"route must lead to")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	var peerAddr netip.Addr
	if *peer != "" {
		a, err := netip.ParseAddr(*peer)
		if err != nil {
			fmt.Fprintf(stderr, "check: -peer: %v\n", err)
			return 2
		}
		peerAddr = a
	}
	if fs.NArg() > 0 || (*output != "text" && *output != "json") {
		fmt.Fprintln(stderr, "check: usage: check [-stack NAME | -config FILE] [-o text|json] [-wg-interface NAME] [-peer ADDR]")
		return 2
	}
	file := *configFile
	if file == "" {
		file = "Pulumi." + *stack + ".yaml"
	}
	sc, err := config.LoadStackFile(file)
	if err != nil {
		fmt.Fprintf(stderr, "check: read %s: %v\n", file, err)
		return 1
	}
	cfg, err := config.ParseValues(sc.Values)
	if err != nil {
		fmt.Fprintf(stderr, "check: %s: %v\n", file, err)
		return 1
	}

	src := Sources{Host: LinuxHost{SysClassNet: "/sys/class/net"}}
	if rc, err := kubeclient.RESTConfig(*kubeconfig, *kubeContext); err != nil {
		src.KubeError = err
	} else {
		rc.UserAgent = "dynk8s-check"
		if src.Kube, err = kubernetes.NewForConfig(rc); err == nil {
			src.Dynamic, err = dynamic.NewForConfig(rc)
		}
		if err != nil {
			src.Kube, src.Dynamic, src.KubeError = nil, nil, fmt.Errorf("client: %w", err)
		}
	}
	if wg, err := wgctrl.New(); err != nil {
		src.WireGuardError = err
	} else {
		defer wg.Close()
		src.WireGuard = wg
	}
	r := Run(ctx, src, Input{Stack: *stack, Config: cfg, Interface: *iface, Peer: peerAddr, Now: time.Now()})
	if *output == "json" {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		err = enc.Encode(r)
	} else {
		err = r.WriteText(stdout)
	}
	if err != nil {
		fmt.Fprintf(stderr, "check: %v\n", err)
		return 1
	}
	if r.Failed() {
		return 1
	}
	return 0
}

// WriteText writes one line per check, then what to change for each failure.
func (r Report) WriteText(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	failed := 0
	for _, res := range r.Results {
		detail := res.Detail
		if (res.Status == Skip || res.Status == Warn) && res.Fix != "" {
			detail += " (" + res.Fix + ")"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\n", res.Status, res.Check, detail)
		if res.Status == Fail {
			failed++
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if failed == 0 {
		_, err := fmt.Fprintln(w, "\nNo check failed.")
		return err
	}
	fmt.Fprintf(w, "\n%d check(s) failed. What to change:\n", failed)
	for _, res := range r.Results {
		if res.Status == Fail && res.Fix != "" {
			fmt.Fprintf(w, "  - %s: %s\n", res.Check, res.Fix)
		}
	}
	return nil
}
