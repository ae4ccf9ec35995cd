package plan

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/dynk8s/dynk8s/cmd/plan/mockcloud"
	"github.com/dynk8s/dynk8s/infra"
)

// BakedImage is one baked pool's image build, as the program declares it: what `pulumi up` builds with EC2 Image
// Builder before the pool's launch template can boot it.
type BakedImage struct {
	Pool string `json:"pool"`
	Arch string `json:"arch"`
	// Kubernetes is the version the image holds (the recipe's infra.KubernetesVersionTag).
	Kubernetes string `json:"kubernetes"`
	// RecipeVersion is the recipe's content-derived version: the Kubernetes minor and patch, then a hash.
	RecipeVersion    string `json:"recipeVersion"`
	ComponentVersion string `json:"componentVersion"`
	// ParentImage is the pool's Fedora image the build starts from.
	ParentImage       string `json:"parentImage"`
	BuildInstanceType string `json:"buildInstanceType"`
	VolumeGiB         int    `json:"volumeGiB"`
	// Image is the Image resource, whose AMI the pool's launch template boots.
	Image string `json:"image"`
}

// BakedImages are the declared image builds, by image resource name: each image with its recipe, component and
// infrastructure configuration, joined by the ARNs the program wires between them.
func (r *Result) BakedImages() []BakedImage {
	resources := r.Resources()
	byARN := map[string]map[string]any{}
	for _, res := range resources {
		if !strings.HasPrefix(res.Type, "aws:imagebuilder/") || res.Read {
			continue
		}
		if arn, ok := mockcloud.Plain(res.Outputs["arn"], false).(string); ok {
			byARN[arn] = mockcloud.PlainMap(res.Inputs, false)
		}
	}
	var out []BakedImage
	for _, res := range resources {
		if res.Type != "aws:imagebuilder/image:Image" || res.Read {
			continue
		}
		in := mockcloud.PlainMap(res.Inputs, false)
		recipe := byARN[str(in["imageRecipeArn"])]
		build := byARN[str(in["infrastructureConfigurationArn"])]
		tags, _ := recipe["tags"].(map[string]any)
		b := BakedImage{
			Pool:          strings.TrimSuffix(strings.TrimPrefix(res.Name, "pool-"), "-image"),
			RecipeVersion: str(recipe["version"]),
			Kubernetes:    str(tags[infra.KubernetesVersionTag]),
			ParentImage:   str(recipe["parentImage"]),
			Image:         res.Name,
		}
		for _, c := range list(recipe["components"]) {
			c, _ := c.(map[string]any)
			if comp := byARN[str(c["componentArn"])]; comp != nil {
				b.ComponentVersion = str(comp["version"])
			}
		}
		for _, m := range list(recipe["blockDeviceMappings"]) {
			m, _ := m.(map[string]any)
			ebs, _ := m["ebs"].(map[string]any)
			gib, _ := ebs["volumeSize"].(float64)
			b.VolumeGiB += int(gib)
		}
		if types := list(build["instanceTypes"]); len(types) > 0 {
			b.BuildInstanceType = str(types[0])
		}
		name := str(build["name"])
		b.Arch = name[strings.LastIndex(name, "-")+1:]
		out = append(out, b)
	}
	return out
}

// WriteBakedImages writes the image builds, if any, as a table.
func (r *Result) WriteBakedImages(w io.Writer) error {
	images := r.BakedImages()
	if len(images) == 0 {
		return nil
	}
	fmt.Fprintf(w, "\nBaked images (EC2 Image Builder, built by `pulumi up` before the pool's launch template; "+
		"about 20-35 min each, an estimate; timeout %s):\n", infra.BuildTimeout)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "  POOL\tARCH\tKUBERNETES\tRECIPE\tCOMPONENT\tFROM\tBUILD ON\tVOLUME")
	for _, b := range images {
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\t%s\t%s\t%d GiB\n", b.Pool, b.Arch, b.Kubernetes, b.RecipeVersion,
			b.ComponentVersion, b.ParentImage, b.BuildInstanceType, b.VolumeGiB)
	}
	return tw.Flush()
}
