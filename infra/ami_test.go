package infra_test

import (
	"errors"
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/dynk8s/dynk8s/cmd/plan/mockcloud"
	"github.com/dynk8s/dynk8s/cmd/plan/plan"
	"github.com/dynk8s/dynk8s/infra"
	"github.com/dynk8s/dynk8s/infra/config"
	"github.com/dynk8s/dynk8s/internal/kube"
)

// Real Fedora image names, both upload schemes, and which query each must and must not satisfy.
func TestFedoraImageNames(t *testing.T) {
	type query struct {
		release int
		arch    kube.Arch
		region  string
	}
	x86in42 := query{42, "x86_64", "eu-central-1"}
	cases := []struct {
		name  string
		query query
		match bool
	}{
		{"Fedora-Cloud-Base-AmazonEC2.x86_64-42-1.1", x86in42, true},
		{"Fedora-Cloud-Base-AmazonEC2.aarch64-42-1.1", query{42, "arm64", "eu-central-1"}, true},
		{"Fedora-Cloud-Base-AmazonEC2.x86_64-41-1.4", query{41, "x86_64", "us-east-1"}, true},
		{"Fedora-Cloud-Base-AmazonEC2.x86_64-43-1.6", query{43, "x86_64", "us-east-1"}, true},
		// date-labelled composes are deleted about ten days after upload: never pick them
		{"Fedora-Cloud-Base-AmazonEC2.x86_64-42-20251120.0", x86in42, false},
		// prereleases
		{"Fedora-Cloud-Base-AmazonEC2.x86_64-42-Prerelease-1.2", x86in42, false},
		{"Fedora-Cloud-Base-AmazonEC2.x86_64-41-Prerelease-1.2", query{41, "x86_64", "us-east-1"}, false},
		// other releases, including one whose number starts with the pinned one
		{"Fedora-Cloud-Base-AmazonEC2.x86_64-43-1.6", x86in42, false},
		{"Fedora-Cloud-Base-AmazonEC2.x86_64-41-1.4", x86in42, false},
		{"Fedora-Cloud-Base-AmazonEC2.x86_64-420-1.1", x86in42, false},
		// other arch
		{"Fedora-Cloud-Base-AmazonEC2.aarch64-42-1.1", x86in42, false},
		// the F39-and-older scheme: region and volume type in the name
		{"Fedora-Cloud-Base-38-1.6.x86_64-hvm-us-west-2-gp3-0", query{38, "x86_64", "us-west-2"}, true},
		{"Fedora-Cloud-Base-39-1.5.aarch64-hvm-eu-central-1-gp3-0", query{39, "arm64", "eu-central-1"}, true},
		{"Fedora-Cloud-Base-38-1.6.x86_64-hvm-us-west-2-gp2-0", query{38, "x86_64", "us-west-2"}, false},
		{"Fedora-Cloud-Base-38-1.6.x86_64-hvm-us-west-2-standard-0", query{38, "x86_64", "us-west-2"}, false},
		{"Fedora-Cloud-Base-38-1.6.x86_64-hvm-eu-west-1-gp3-0", query{38, "x86_64", "us-west-2"}, false},
		{"Fedora-Cloud-Base-39_Beta-1.1.x86_64-hvm-us-west-2-gp3-0", query{39, "x86_64", "us-west-2"}, false},
		{"Fedora-Cloud-Base-39-20240912.0.x86_64-hvm-us-west-2-gp3-0", query{39, "x86_64", "us-west-2"}, false},
		// during the F40 transition both schemes existed; F40 uses the new one
		{"Fedora-Cloud-Base-40-1.14.x86_64-hvm-us-west-2-gp3-0", query{40, "x86_64", "us-west-2"}, false},
		{"Fedora-Cloud-Base-AmazonEC2.x86_64-40-1.14", query{40, "x86_64", "us-west-2"}, true},
	}
	for _, tc := range cases {
		q, err := infra.FedoraImage(tc.query.release, tc.query.arch, tc.query.region)
		assert.NilError(t, err)
		assert.Check(t, q.Matches(tc.name) == tc.match, "%s vs %+v: want match=%v (regex %s)",
			tc.name, tc.query, tc.match, q.NameRegex)
	}
}

// TestFedoraLookupPicksGA evaluates the stack's queries against a catalog where newer prereleases and
// date-labelled composes sit beside the GA image, as EC2 would (filters, then nameRegex, then most recent).
func TestFedoraLookupPicksGA(t *testing.T) {
	type image struct {
		release int
		arch    kube.Arch
	}
	want := map[image]string{
		{42, "x86_64"}: "Fedora-Cloud-Base-AmazonEC2.x86_64-42-1.1",
		{42, "arm64"}:  "Fedora-Cloud-Base-AmazonEC2.aarch64-42-1.1",
		{41, "arm64"}:  "Fedora-Cloud-Base-AmazonEC2.aarch64-41-1.4",
		{43, "x86_64"}: "Fedora-Cloud-Base-AmazonEC2.x86_64-43-1.6",
		{44, "arm64"}:  "Fedora-Cloud-Base-AmazonEC2.aarch64-44-1.7",
		{39, "x86_64"}: "Fedora-Cloud-Base-39-1.5.x86_64-hvm-eu-central-1-gp3-0",
		{38, "arm64"}:  "Fedora-Cloud-Base-38-1.6.aarch64-hvm-eu-central-1-gp3-0",
	}
	for key, name := range want {
		q, err := infra.FedoraImage(key.release, key.arch, "eu-central-1")
		assert.NilError(t, err)
		im, err := mockcloud.SelectImage(mockcloud.FedoraCatalog, []string{infra.FedoraOwner}, q.NameFilter,
			string(q.Architecture), q.NameRegex)
		assert.NilError(t, err, "%v", key)
		assert.Equal(t, im.Name, name, "%v", key)
	}
	// A release the catalog lacks finds nothing rather than something else.
	q, err := infra.FedoraImage(45, "x86_64", "eu-central-1")
	assert.NilError(t, err)
	_, err = mockcloud.SelectImage(mockcloud.FedoraCatalog, []string{infra.FedoraOwner}, q.NameFilter, string(q.Architecture),
		q.NameRegex)
	assert.ErrorContains(t, err, "no results")
	_, err = infra.FedoraImage(12, "x86_64", "eu-central-1")
	assert.ErrorContains(t, err, "naming scheme")
}

// TestPoolImageIsTheGAImage: the launch templates boot the image the lookup resolved, for their own arch.
func TestPoolImageIsTheGAImage(t *testing.T) {
	res := runStack(t, devConfig(t))
	byName := map[string]mockcloud.Image{}
	for _, im := range mockcloud.FedoraCatalog {
		byName[im.Name] = im
	}
	x86 := find(t, res, "aws:ec2/launchTemplate:LaunchTemplate", "pool-builders-x86-lt")
	arm := find(t, res, "aws:ec2/launchTemplate:LaunchTemplate", "pool-builders-arm-lt")
	assert.Equal(t, in(x86, "imageId"), byName["Fedora-Cloud-Base-AmazonEC2.x86_64-44-1.7"].ID())
	assert.Equal(t, in(arm, "imageId"), byName["Fedora-Cloud-Base-AmazonEC2.aarch64-44-1.7"].ID())
	gw := find(t, res, "aws:ec2/instance:Instance", "gateway")
	assert.Equal(t, in(gw, "ami"), byName["Fedora-Cloud-Base-AmazonEC2.aarch64-44-1.7"].ID(), "t4g is arm64")

	// A pinned image skips the Fedora lookup for that pool.
	c := devConfig(t)
	pool(c, 0)["amiId"] = "ami-0123456789abcdef0"
	res = runStack(t, c)
	assert.Equal(t, in(find(t, res, "aws:ec2/launchTemplate:LaunchTemplate", "pool-builders-x86-lt"), "imageId"),
		"ami-0123456789abcdef0")
}

// TestPinnedImageArchitecture: a pool's amiId of another architecture than the pool's types fails the preview on
// that key, before anything is declared (AWS N10); one of the right architecture passes.
func TestPinnedImageArchitecture(t *testing.T) {
	c := devConfig(t)
	pool(c, 1)["amiId"] = "ami-0123456789abcdef0" // x86_64, on the arm64 pool
	cfg, err := mockcloud.ConfigFromMap(c)
	assert.NilError(t, err)
	res, err := plan.RunConfig("dev", cfg)
	var cfgErr *config.Error
	assert.Assert(t, errors.As(err, &cfgErr), "got %v", err)
	assert.Equal(t, cfgErr.Errors[0].Path, "dynk8s:nodePools[1].amiId")
	assert.Check(t, is.Contains(cfgErr.Errors[0].Msg, "image ami-0123456789abcdef0 is x86_64, the pool's instance types are arm64"))
	assert.Equal(t, len(res.Cloud.Resources()), 0, "nothing declared")

	pool(c, 1)["amiId"] = mockcloud.PinnedArmImage
	res = runStack(t, c)
	assert.Equal(t, in(find(t, res, "aws:ec2/launchTemplate:LaunchTemplate", "pool-builders-arm-lt"), "imageId"),
		mockcloud.PinnedArmImage)
}
