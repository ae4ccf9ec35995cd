// Command build is the burst test's build pod: what a build that needs fuse does to its node, and nothing more. It
// opens /dev/fuse (the device the fuse device plugin hands the container for its github.com/fuse request), writes
// 8 MiB into $BUILD_DIR (its emptyDir, on the node's ephemeral storage), reads the size back, and exits 0; any step
// that fails exits 1 with its reason, so the pod fails instead of succeeding.
package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
)

const size = 8 << 20

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "build:", err)
		os.Exit(1)
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
	return nil
}
