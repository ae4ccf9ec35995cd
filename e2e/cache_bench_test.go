//go:build e2e

package e2e

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"gotest.tools/v3/assert"
)

// The build cache benchmark (make bench-cache): what a pool's build cache saves a build, cold against warm. A Go
// build of one of this repository's commands runs in the box (the cached Debian root under systemd-nspawn, not
// booted) with GOMODCACHE and GOCACHE on a volume as a node mounts its cache: ext4 made as the node's cache phase
// makes it (mkfs.ext4 -m 0 -L dynk8s-cache), on a loop device over a sparse file, mounted noatime. Each run builds
// twice: cold, the volume emptied (a pool's first node), and warm, after the volume was unmounted and mounted again
// (the next node attaching it); the page cache is dropped before each build, so neither reads what the machine
// kept. Modules come from a file:// proxy of the host's module cache, bound into the box read-only: the cold figure
// has no network in it, where a node downloads from the Go module proxy, so the saving on EC2 is larger. A
// measurement, not a test: without -cache.runs it is skipped, so `make e2e` never runs it.
var (
	cacheRuns = flag.Int("cache.runs", 0, "TestCacheBenchmark: cold and warm builds of each run (0: skip)")
	cachePkg  = flag.String("cache.pkg", "./node/cmd/dynk8s-node", "TestCacheBenchmark: the package built")
	cacheOut  = flag.String("cache.out", "", "TestCacheBenchmark: also write the table to this file")
)

// cacheBenchMount is the pool's cache mount in the box (config.Cache's default mountPath).
const cacheBenchMount = "/var/lib/dynk8s-cache"

func TestCacheBenchmark(t *testing.T) {
	if *cacheRuns <= 0 {
		t.Skip("the build cache benchmark runs with -cache.runs=N (make bench-cache)")
	}
	nspawn, root := requireNspawn(t), boxRoot(t)
	for _, tool := range []string{"losetup", "mkfs.ext4", "mount", "umount", "go"} {
		requireTool(t, tool)
	}
	ctx := context.Background()
	goEnv := func(name string) string {
		out, err := exec.Command("go", "env", name).Output()
		if err != nil {
			t.Fatalf("go env %s: %v", name, err)
		}
		return strings.TrimSpace(string(out))
	}
	goroot, proxy := goEnv("GOROOT"), filepath.Join(goEnv("GOMODCACHE"), "cache", "download")
	src, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	// The modules the build needs, in the host's module cache that the box's proxy serves.
	if out, err := exec.Command("go", "-C", src, "mod", "download").CombinedOutput(); err != nil {
		t.Fatalf("go mod download: %v: %s", err, out)
	}

	dir := t.TempDir()
	file, mnt := filepath.Join(dir, "volume.img"), filepath.Join(dir, "mnt")
	assert.NilError(t, os.MkdirAll(mnt, 0o755))
	assert.NilError(t, os.WriteFile(file, nil, 0o600))
	assert.NilError(t, os.Truncate(file, 20<<30))
	loop := strings.TrimSpace(runOut(t, "losetup", "--find", "--show", file))
	t.Cleanup(func() { _ = exec.Command("losetup", "-d", loop).Run() })
	runOut(t, "mkfs.ext4", "-q", "-F", "-m", "0", "-L", "dynk8s-cache", loop)
	mount := func() { runOut(t, "mount", "-o", "noatime", loop, mnt) }
	unmount := func() { runOut(t, "umount", mnt) }
	mount()
	t.Cleanup(func() { _ = exec.Command("umount", mnt).Run() })

	build := func(what string) float64 {
		t.Helper()
		assert.NilError(t, os.WriteFile("/proc/sys/vm/drop_caches", []byte("3"), 0o200))
		script := `start=$(date +%s.%N); go build -o /tmp/out "$PKG" || exit 1; end=$(date +%s.%N); echo "$start $end"`
		cmd := nspawnIn(ctx, nspawn, root, "--volatile=overlay", "--bind-ro="+goroot+":/usr/local/go",
			"--bind-ro="+proxy+":/proxy", "--bind-ro="+src+":/src", "--bind="+mnt+":"+cacheBenchMount,
			"--chdir=/src", "--setenv=PATH=/usr/local/go/bin:/usr/bin:/bin", "--setenv=HOME=/root",
			"--setenv=GOPROXY=file:///proxy", "--setenv=GOSUMDB=off", "--setenv=GOTOOLCHAIN=local",
			"--setenv=GOFLAGS=-buildvcs=false -mod=readonly", "--setenv=CGO_ENABLED=0",
			"--setenv=GOMODCACHE="+cacheBenchMount+"/go/mod", "--setenv=GOCACHE="+cacheBenchMount+"/go/build",
			"--setenv=PKG="+*cachePkg, "sh", "-c", script)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%s build of %s in the box: %v\n%s", what, *cachePkg, err, out)
		}
		// The script's last line; systemd-nspawn may warn after it.
		lines := strings.Split(strings.TrimSpace(string(out)), "\n")
		for i := len(lines) - 1; i >= 0; i-- {
			if f := strings.Fields(lines[i]); len(f) == 2 {
				start, err1 := strconv.ParseFloat(f[0], 64)
				end, err2 := strconv.ParseFloat(f[1], 64)
				if err1 == nil && err2 == nil {
					return end - start
				}
			}
		}
		t.Fatalf("%s build: no times in %q", what, out)
		return 0
	}
	var cold, warm []float64
	for i := range *cacheRuns {
		assert.NilError(t, os.RemoveAll(filepath.Join(mnt, "go")))
		cold = append(cold, build("cold"))
		size := strings.Fields(runOut(t, "du", "-sm", filepath.Join(mnt, "go")))[0]
		unmount()
		mount()
		warm = append(warm, build("warm"))
		t.Logf("run %d: cold %.1f s, warm %.1f s, the cache %s MiB", i+1, cold[i], warm[i], size)
	}
	table := fmt.Sprintf("Measured %s on %s (%d CPUs), `go build %s` in the box, %d runs; seconds: median "+
		"[min, max] (every run's value).\n\n| build | seconds |\n| --- | --- |\n| cold: the volume empty, modules "+
		"from a local proxy | %s |\n| warm: the same volume mounted again | %s |\n| saved (medians) | %.1f s |\n",
		time.Now().UTC().Format("2006-01-02"), runtime.GOARCH, runtime.NumCPU(), *cachePkg, *cacheRuns,
		summary(cold), summary(warm), median(cold)-median(warm))
	t.Logf("build cache benchmark:\n%s", table)
	if *cacheOut != "" {
		assert.NilError(t, os.WriteFile(*cacheOut, []byte(table), 0o644))
	}
}

// summary is median [min, max] (each value).
func summary(v []float64) string {
	s := make([]string, len(v))
	for i, x := range v {
		s[i] = fmt.Sprintf("%.1f", x)
	}
	return fmt.Sprintf("%.1f [%.1f, %.1f] (%s)", median(v), slices.Min(v), slices.Max(v), strings.Join(s, ", "))
}

func runOut(t *testing.T, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v: %s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}
