// Command build is the burst test's build pod: what a build that needs fuse does to its node, and nothing more. It
// opens /dev/fuse (the device the fuse device plugin hands the container for its github.com/fuse request), writes
// 8 MiB into $BUILD_DIR (its emptyDir, on the node's ephemeral storage), reads the size back, and exits 0; any step
// that fails exits 1 with its reason, so the pod fails instead of succeeding.
//
// With $CACHE_DIR (the node's build cache, a hostPath under its mount) it also reads the builds that ran before it
// from $CACHE_DIR/builds, fails when there are fewer than $CACHE_WANT of them (the cache was not kept), and adds its
// own line naming its node ($NODE_NAME). What it found is its termination message, which the kubelet posts in the
// pod's status.
//
// With $BUILD_HOLD (a Go duration) it stays up that long after its work, as a real build runs for minutes: the
// kubelet reports a container running when its next look at the runtime (a relist every second) finds it so, and
// one that has exited by then is never reported running, only Pending and then, two seconds later, Succeeded.
package main

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

const size = 8 << 20

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "build:", err)
		os.Exit(1)
	}
	if hold := os.Getenv("BUILD_HOLD"); hold != "" {
		d, err := time.ParseDuration(hold)
		if err != nil {
			fmt.Fprintln(os.Stderr, "build: BUILD_HOLD:", err)
			os.Exit(1)
		}
		time.Sleep(d)
	}
}

func run() error {
	dev, err := os.OpenFile("/dev/fuse", os.O_RDWR, 0)
	if err != nil {
		return fmt.Errorf("open the fuse device: %w", err)
	}
	if err := dev.Close(); err != nil {
		return err
	}
	dir := os.Getenv("BUILD_DIR")
	if dir == "" {
		return fmt.Errorf("BUILD_DIR is not set")
	}
	out := filepath.Join(dir, "artifact")
	f, err := os.Create(out)
	if err != nil {
		return err
	}
	if _, err := f.Write(bytes.Repeat([]byte{'x'}, size)); err != nil {
		return fmt.Errorf("write %s: %w", out, err)
	}
	if err := f.Sync(); err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	st, err := os.Stat(out)
	if err != nil {
		return err
	}
	if st.Size() != size {
		return fmt.Errorf("%s has %d bytes, want %d", out, st.Size(), size)
	}
	fmt.Printf("build: opened /dev/fuse, wrote %d bytes to %s\n", st.Size(), out)
	if dir := os.Getenv("CACHE_DIR"); dir != "" {
		return cache(dir)
	}
	return nil
}

// cache reads the earlier builds' lines from the cache and adds this one's.
func cache(dir string) error {
	want, err := strconv.Atoi(os.Getenv("CACHE_WANT"))
	if err != nil {
		return fmt.Errorf("CACHE_WANT: %w", err)
	}
	path := filepath.Join(dir, "builds")
	old, err := os.ReadFile(path)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	earlier := strings.Fields(string(old))
	found := fmt.Sprintf("cache: %d earlier builds %v", len(earlier), earlier)
	if err := os.WriteFile("/dev/termination-log", []byte(found), 0o644); err != nil {
		return err
	}
	if len(earlier) < want {
		return fmt.Errorf("%s, want at least %d: the node's cache was not kept", found, want)
	}
	f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	if _, err := fmt.Fprintln(f, os.Getenv("NODE_NAME")); err != nil {
		return err
	}
	if err := f.Sync(); err != nil {
		return err
	}
	fmt.Println("build:", found)
	return f.Close()
}
