package main

import (
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"gotest.tools/v3/assert"
	"gotest.tools/v3/golden"

	"github.com/dynk8s/dynk8s/cmd/plan/plan"
	"github.com/dynk8s/dynk8s/internal/testkit/scriptstub"
)

// The whole-stack golden, as kops keeps one per cluster (kubernetes/kops tests/integration/update_cluster): for each
// example stack, what `go run ./cmd/plan -stack NAME -out DIR` writes, under testdata/stacks/NAME: plan.json (every
// resource with its inputs and options, embedded documents replaced by a pointer to their file), the decoded user
// data (each embedded boot script as its name alone, its sha256 and line count once in userdata/scripts.txt:
// internal/testkit/scriptstub), every IAM policy
// document, every in-cluster manifest and the on-prem WireGuard config. Any change to what
// the stack declares shows here as a reviewable diff; `make golden` rewrites the files.

// scriptsManifest is where a stack's golden pins the boot scripts its user data embeds, a line each.
const scriptsManifest = "userdata/scripts.txt"

// privateKeyLine matches a wg-quick private key: a stand-in in the plan, but nothing that looks like a key belongs
// in the repository.
var privateKeyLine = regexp.MustCompile(`(?m)^PrivateKey = .*$`)

func TestWholeStackGolden(t *testing.T) {
	for _, stack := range []string{"dev", "prod"} {
		t.Run(stack, func(t *testing.T) {
			result, err := plan.Run(stack, "Pulumi."+stack+".yaml")
			assert.NilError(t, err)
			files, err := result.Artifacts()
			assert.NilError(t, err)
			if conf, ok := files[plan.OnPremConfigFile]; ok {
				files[plan.OnPremConfigFile] = privateKeyLine.ReplaceAll(conf, []byte("PrivateKey = [secret]"))
			}
			scripts := scriptstub.Manifest{}
			for rel, ud := range files {
				if strings.HasPrefix(rel, "userdata/") {
					stubbed, err := scriptstub.Stub(string(ud), filepath.Join("cloudinit", "scripts"), scripts)
					assert.NilError(t, err, rel)
					files[rel] = []byte(stubbed)
				}
			}
			files[scriptsManifest] = []byte(scripts.String())
			dir := filepath.Join("stacks", stack)
			for _, rel := range slices.Sorted(maps.Keys(files)) {
				golden.Assert(t, string(files[rel]), filepath.Join(dir, rel))
			}
			// No stale file: everything under the stack's directory is something this run rendered.
			err = filepath.WalkDir(filepath.Join("testdata", dir), func(path string, d fs.DirEntry, err error) error {
				if err != nil || d.IsDir() {
					return err
				}
				rel, err := filepath.Rel(filepath.Join("testdata", dir), path)
				if err != nil {
					return err
				}
				if _, ok := files[rel]; !ok {
					if golden.FlagUpdate() {
						return os.Remove(path)
					}
					t.Errorf("stale golden file %s: the stack no longer renders it (make golden removes it)", path)
				}
				return nil
			})
			assert.NilError(t, err)
		})
	}
}
