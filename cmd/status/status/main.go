// Package status is cmd/status: it reads a running stack's state from EC2 Auto Scaling, EC2, SSM, the cluster and
// this host's WireGuard, and prints it as one screen or as JSON.
package status

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	awsconfig "github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/autoscaling"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/ssm"
	"github.com/aws/smithy-go/logging"
	"golang.zx2c4.com/wireguard/wgctrl"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/metadata"

	"github.com/dynk8s/dynk8s/cmd/internal/kubeclient"
	"github.com/dynk8s/dynk8s/cmd/plan/plan"
	"github.com/dynk8s/dynk8s/infra/config"
)

// Main is cmd/status: it parses args, reads the stack file, reads the state and prints it. It returns 0 when
// everything was read and nothing needs the operator, 1 when something does or could not be read (or the stack
// file is wrong), 2 on bad usage.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("status", flag.ContinueOnError)
	fs.SetOutput(stderr)
	stack := fs.String("stack", "dev", "stack name: reads Pulumi.<stack>.yaml")
	configFile := fs.String("config", "", "stack config file to read instead of Pulumi.<stack>.yaml")
	kubeconfig := fs.String("kubeconfig", "", "kubeconfig of the cluster (default: $KUBECONFIG, else ~/.kube/config)")
	kubeContext := fs.String("context", "", "kubeconfig context (default: the current one)")
	output := fs.String("o", "text", "output: text (one screen) or json")
	iface := fs.String("wg-interface", "", "the on-prem peer's WireGuard interface (default: the one whose peer "+
		"routes the stack's VPC)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() > 0 || (*output != "text" && *output != "json") {
		fmt.Fprintln(stderr, "status: usage: status [-stack NAME | -config FILE] [-o text|json] [-wg-interface NAME]")
		return 2
	}
	file := *configFile
	if file == "" {
		file = "Pulumi." + *stack + ".yaml"
	}
	sc, err := config.LoadStackFile(file)
	if err != nil {
		fmt.Fprintf(stderr, "status: read %s: %v\n", file, err)
		return 1
	}
	cfg, err := config.ParseValues(sc.Values)
	if err != nil {
		fmt.Fprintf(stderr, "status: %s: %v\n", file, err)
		return 1
	}
	in := Input{Stack: *stack, Config: cfg, Interface: *iface}
	if res, err := plan.Run(*stack, file); err != nil {
		in.BillError = err
	} else {
		bill := res.IdleBill()
		in.Bill = &bill
	}

	src := Sources{}
	src.Kube, src.Metadata, src.KubeError = kubeClients(*kubeconfig, *kubeContext)
	src.AutoScaling, src.EC2, src.SSM, src.AWSError = awsClients(ctx, cfg.Region)
	if wg, err := wgctrl.New(); err != nil {
		src.WireGuardError = err
	} else {
		defer wg.Close()
		src.WireGuard = wg
	}

	in.Now = time.Now()
	r := Collect(ctx, src, in)
	if *output == "json" {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		err = enc.Encode(r)
	} else {
		err = r.WriteText(stdout)
	}
	if err != nil {
		fmt.Fprintf(stderr, "status: %v\n", err)
		return 1
	}
	if len(r.Problems) > 0 || len(r.Unread) > 0 {
		return 1
	}
	return 0
}

// kubeClients are the cluster's typed and metadata clients from the operator's kubeconfig.
func kubeClients(kubeconfig, kubeContext string) (kubernetes.Interface, metadata.Interface, error) {
	rc, err := kubeclient.RESTConfig(kubeconfig, kubeContext)
	if err != nil {
		return nil, nil, err
	}
	rc.UserAgent = "dynk8s-status"
	kc, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, nil, fmt.Errorf("client: %w", err)
	}
	mc, err := metadata.NewForConfig(rc)
	if err != nil {
		return nil, nil, fmt.Errorf("client: %w", err)
	}
	return kc, mc, nil
}

// awsClients are the SDK's clients for the region with the credentials of the SDK's default chain (the
// operator's profile, environment or role; AWS_ENDPOINT_URL and its per-service forms as the SDK reads them),
// once they resolve: without credentials no AWS part is read, and the reason is said once.
func awsClients(ctx context.Context, region string) (AutoScaling, EC2, SSM, error) {
	cfg, err := awsconfig.LoadDefaultConfig(ctx, awsconfig.WithRegion(region), awsconfig.WithLogger(logging.Nop{}),
		awsconfig.WithRetryer(func() aws.Retryer { return retry.AddWithMaxAttempts(retry.NewStandard(), 3) }))
	if err != nil {
		return nil, nil, nil, fmt.Errorf("AWS configuration: %w", err)
	}
	cctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	if _, err := cfg.Credentials.Retrieve(cctx); err != nil {
		return nil, nil, nil, fmt.Errorf("no AWS credentials: %w", err)
	}
	return autoscaling.NewFromConfig(cfg), ec2.NewFromConfig(cfg), ssm.NewFromConfig(cfg), nil
}
