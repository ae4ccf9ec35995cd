package image

import (
	"context"

	"github.com/dynk8s/dynk8s/node/internal/cli"
)

// Clean is `dynk8s-node clean-identity`: an image build's last step, after prepare.
func Clean(_ context.Context, env *cli.Env) error {
	return CleanIdentity(env.Files, env.Log, env.DryRun)
}

// Check is `dynk8s-node check-image --config-sha256 HEX`: an image build's validate step, after clean-identity.
// The image passes when its marker is one this agent reads, baked from the node.json whose sha256 is HEX, and the
// instance's identity is gone (machine-id "uninitialized", which systemd replaces at the first boot, and nothing in
// the kubelet's pki directory: a key there would be every node's kubelet bootstrap key), and firewalld, if the image
// has it, is not enabled (it would filter the pods' forwarded traffic on every node).
func Check(_ context.Context, env *cli.Env) error {
	want := env.String("config-sha256")
	if want == "" {
		return cli.UsageError("--config-sha256 HEX")
	}
	if err := CheckImage(env.Files, want); err != nil {
		return err
	}
	env.Log.Printf("the image is baked from node.json %s, its identity removed", want)
	return nil
}
