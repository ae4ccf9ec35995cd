package plan

import (
	"fmt"
	"io"
	"strconv"
	"text/tabwriter"

	"github.com/dynk8s/dynk8s/cmd/plan/mockcloud"
	"github.com/dynk8s/dynk8s/infra"
	"github.com/dynk8s/dynk8s/internal/names"
)

// BakedImage is one baked pool's image as the program looked it up. The program does not build it: cmd/bake bakes
// it before `pulumi up` and tags it, and the program finds the newest image of the account with the pool's tags,
// the identity infra.BakeID among them. Without one the preview fails, naming the command that bakes it.
type BakedImage struct {
	Pool string `json:"pool"`
	Arch string `json:"arch"`
	// Image is the image the lookup found, which the pool's launch template boots: in the plan, a stand-in
	// (mockcloud.StandInBakedImage), as if the bake had run.
	Image string `json:"image"`
	// VolumeGiB is the image's root snapshot as EC2 reports it (the stand-in's, mockcloud.BakedSnapshotGiB).
	VolumeGiB int `json:"volumeGiB"`
	// BakeSHA256 is the pool's bake identity (infra.BakeID), the value of the image's infra.BakeTag.
	BakeSHA256 string `json:"bakeSha256"`
	// Note is how the program finds the image (the tag infra.BakeTag and the pool's identity) and the command that
	// bakes it.
	Note string `json:"note"`
}

// BakedImages are the baked pools' images the program looked up, in the order it asked: the image lookups by
// infra.BakeTag that found one.
func (r *Result) BakedImages() []BakedImage {
	var out []BakedImage
	for _, c := range r.Cloud.Calls() {
		filters := mockcloud.AMIFilters(c.Args)
		id, ok := filters["tag:"+infra.BakeTag]
		if c.Token != "aws:ec2/getAmi:getAmi" || !ok || c.Err != nil {
			continue
		}
		res := mockcloud.PlainMap(c.Result, false)
		b := BakedImage{Pool: filters["tag:"+names.TagPool], Arch: str(res["architecture"]), Image: str(res["id"]),
			BakeSHA256: id}
		for _, m := range list(res["blockDeviceMappings"]) {
			m, _ := m.(map[string]any)
			ebs, _ := m["ebs"].(map[string]any)
			// The data source reports the size as a string (terraform-provider-aws flattens the mapping so).
			gib, _ := strconv.Atoi(str(ebs["volume_size"]))
			b.VolumeGiB += gib
		}
		b.Note = fmt.Sprintf("the newest image of the account tagged %s=%s, %s=%s and %s=%s; without one the "+
			"preview fails: bake it with `%s`", names.TagCluster, filters["tag:"+names.TagCluster], names.TagPool,
			b.Pool, infra.BakeTag, id, infra.BakeCommand(r.Stack, b.Pool))
		out = append(out, b)
	}
	return out
}

// WriteBakedImages writes the baked pools' images, if any, as a table.
func (r *Result) WriteBakedImages(w io.Writer) error {
	images := r.BakedImages()
	if len(images) == 0 {
		return nil
	}
	fmt.Fprintln(w, "\nBaked images (not built by the program: cmd/bake bakes each before `pulumi up`, and the program "+
		"boots the newest image tagged with the pool's identity; here a stand-in, as if baked; without one the "+
		"preview fails and names the command):")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "  POOL\tARCH\tIMAGE\tLOOKED UP BY\tBAKED BY")
	for _, b := range images {
		fmt.Fprintf(tw, "  %s\t%s\t%s (stand-in)\ttag %s=%s\t%s\n", b.Pool, b.Arch, b.Image, infra.BakeTag, b.BakeSHA256,
			infra.BakeCommand(r.Stack, b.Pool))
	}
	return tw.Flush()
}
