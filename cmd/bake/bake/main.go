package bake

import (
	"context"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	awsconfig "github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/smithy-go/logging"

	"github.com/dynk8s/dynk8s/infra"
	"github.com/dynk8s/dynk8s/infra/config"
)

// Timeout is a bake's default bound, launch to available image: the instance's boot (nodeconfig.LaunchEstimate),
// the agent's fetch unit (nodeconfig.BakeAgentFetch and its slack: 20.5 min, for a new stack's first minutes), the
// bake unit (nodeconfig.BakeDeadline and UnitSlack: 32 min), the power-off, and the image's first, full snapshot
// (5-15 min for a few GiB written, an estimate: AWS publishes no figure), with room.
const Timeout = 90 * time.Minute

// ExitMissing is -check's status when a pool's image for the current config is missing.
const ExitMissing = 3

// Main runs the command with args, and is its exit status: 0, 1 for a failed bake, 2 for a command line it cannot
// run, ExitMissing for -check with an image missing.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("bake", flag.ContinueOnError)
	fs.SetOutput(stderr)
	stack := fs.String("stack", "dev", "stack name: reads Pulumi.<stack>.yaml")
	configFile := fs.String("config", "", "stack config file to read instead of Pulumi.<stack>.yaml")
	pools := fs.String("pool", "", "the baked pools to bake, comma-separated (default: every baked pool)")
	keep := fs.Int("keep", infra.BakeKeep, "how many of each pool's images to keep, the newest (each bills its snapshot)")
	timeout := fs.Duration("timeout", Timeout, "how long a bake may take, launch to available image")
	keepFailed := fs.Bool("keep-failed", false, "leave a failed bake's instance running for a look (it bills)")
	poll := fs.Duration("poll", 15*time.Second, "how often the bake instance's state and console are read")
	check := fs.Bool("check", false, fmt.Sprintf("bake nothing: say which pools' images for the current config are "+
		"missing, and exit %d if any is", ExitMissing))
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() > 0 || *keep < 1 || *timeout <= 0 || *poll <= 0 {
		fmt.Fprintln(stderr, "bake: usage: bake [-stack NAME | -config FILE] [-pool NAME,...] [-keep N>=1] [-timeout D] [-poll D] [-keep-failed] [-check]")
		return 2
	}
	file := *configFile
	if file == "" {
		file = "Pulumi." + *stack + ".yaml"
	}
	sc, err := config.LoadStackFile(file)
	if err != nil {
		fmt.Fprintf(stderr, "bake: read %s: %v\n", file, err)
		return 1
	}
	cfg, err := config.ParseValues(sc.Values)
	if err != nil {
		fmt.Fprintf(stderr, "bake: %s: %v\n", file, err)
		return 1
	}
	selected, err := selectPools(cfg, *pools)
	if err != nil {
		fmt.Fprintf(stderr, "bake: %s: %v\n", file, err)
		return 2
	}
	if len(selected) == 0 {
		fmt.Fprintf(stderr, "bake: %s has no baked pool (nodePools[].image: baked): nothing to bake\n", file)
		return 0
	}
	ec2c, s3c, err := awsClients(ctx, cfg.Region)
	if err != nil {
		fmt.Fprintf(stderr, "bake: %v\n", err)
		return 1
	}
	b := &Baker{EC2: ec2c, S3: s3c, Config: cfg, Stack: *stack, Log: stderr, Keep: *keep, Timeout: *timeout,
		Poll: *poll, KeepFailed: *keepFailed, Now: time.Now}
	if *check {
		return checkPools(ctx, b, selected, stdout, stderr)
	}
	code := 0
	for _, pool := range selected {
		res, err := b.Bake(ctx, pool)
		if err != nil {
			fmt.Fprintf(stderr, "bake: FAILED: %v\n", err)
			code = 1
			continue
		}
		fmt.Fprintf(stdout, "%s\t%s\t%s=%s\n", res.Pool, res.ImageID, infra.BakeTag, res.BakeID)
	}
	return code
}

// checkPools is -check: one line per pool, "POOL\tIMAGE\tTAG=ID" or "POOL\tmissing\tTAG=ID".
func checkPools(ctx context.Context, b *Baker, pools []config.NodePool, stdout, stderr io.Writer) int {
	code := 0
	for _, pool := range pools {
		res, ok, err := b.Check(ctx, pool)
		switch {
		case err != nil:
			fmt.Fprintf(stderr, "bake: FAILED: %v\n", err)
			return 1
		case ok:
			fmt.Fprintf(stdout, "%s\t%s\t%s=%s\n", res.Pool, res.ImageID, infra.BakeTag, res.BakeID)
		default:
			fmt.Fprintf(stdout, "%s\tmissing\t%s=%s\n", res.Pool, infra.BakeTag, res.BakeID)
			fmt.Fprintf(stderr, "bake: pool %s has no image for this config: %s\n", pool.Name,
				infra.BakeCommand(b.Stack, pool.Name))
			code = ExitMissing
		}
	}
	return code
}

// selectPools are the baked pools named in list (all of them for ""); a name that is no baked pool is an error.
func selectPools(cfg *config.Config, list string) ([]config.NodePool, error) {
	var baked []config.NodePool
	for _, p := range cfg.NodePools {
		if p.Baked() {
			baked = append(baked, p)
		}
	}
	if list == "" {
		return baked, nil
	}
	var out []config.NodePool
	for name := range strings.SplitSeq(list, ",") {
		i := slices.IndexFunc(baked, func(p config.NodePool) bool { return p.Name == name })
		if i < 0 {
			return nil, fmt.Errorf("-pool %s: no baked pool of that name (baked: %s)", name, poolNames(baked))
		}
		out = append(out, baked[i])
	}
	return out, nil
}

func poolNames(pools []config.NodePool) string {
	if len(pools) == 0 {
		return "none"
	}
	var n []string
	for _, p := range pools {
		n = append(n, p.Name)
	}
	return strings.Join(n, ", ")
}

// awsClients are EC2's and S3's, with the operator's credentials (profile, environment or role; AWS_ENDPOINT_URL and
// its per-service forms as the SDK reads them), in the stack's region.
func awsClients(ctx context.Context, region string) (*ec2.Client, *s3.Client, error) {
	cfg, err := awsconfig.LoadDefaultConfig(ctx, awsconfig.WithRegion(region), awsconfig.WithLogger(logging.Nop{}),
		awsconfig.WithRetryer(func() aws.Retryer { return retry.AddWithMaxAttempts(retry.NewStandard(), 5) }))
	if err != nil {
		return nil, nil, fmt.Errorf("AWS configuration: %w", err)
	}
	if _, err := cfg.Credentials.Retrieve(ctx); err != nil {
		return nil, nil, fmt.Errorf("no AWS credentials: %w", err)
	}
	// Path-style: what a test endpoint (moto) serves; AWS serves both for the stack's dotless bucket names.
	return ec2.NewFromConfig(cfg), s3.NewFromConfig(cfg, func(o *s3.Options) { o.UsePathStyle = true }), nil
}
