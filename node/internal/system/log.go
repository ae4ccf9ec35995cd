package system

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"sync"
)

// Logger writes "TAG: message" lines to stderr, which the unit sends to the journal and the console. Outside systemd
// (no JOURNAL_STREAM) each line is copied to the journal with logger(1). Its first line
// names the agent's version, so every boot's log says which binary ran; a run with nothing to say logs nothing.
type Logger struct {
	tag     string
	out     io.Writer
	Journal bool   // copy each line with logger(1)
	kmsg    string // the kernel log device (DYNK8S_ROOT/dev/kmsg)

	mu      sync.Mutex
	started bool
}

// NewLogger logs under tag to out; root is the node's root, where the kernel log device is.
func NewLogger(tag string, out io.Writer, root string) *Logger {
	return &Logger{tag: tag, out: out, Journal: os.Getenv("JOURNAL_STREAM") == "", kmsg: root + "/dev/kmsg"}
}

// With is a logger for another part of the same run (the gateway's wake-up beside the join): same output, own tag.
func (l *Logger) With(tag string) *Logger {
	return &Logger{tag: tag, out: l.out, Journal: l.Journal, kmsg: l.kmsg, started: true}
}

// Printf logs one line, after the line that names the agent at a run's first.
func (l *Logger) Printf(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.started {
		l.started = true
		l.line(fmt.Sprintf("dynk8s-node %s (sha256 %s, %s, %s/%s)", Version, SelfHash(), runtime.Version(), runtime.GOOS,
			runtime.GOARCH))
	}
	l.line(msg)
}

// SelfHash is the sha256 of the running binary: the reproducible build has no version of its own to print, and this
// is the hash the user data pins (agent.env), so the log names exactly which agent ran.
func SelfHash() string {
	f, err := os.Open("/proc/self/exe")
	if err != nil {
		return "unknown"
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "unknown"
	}
	return hex.EncodeToString(h.Sum(nil))
}

func (l *Logger) line(msg string) {
	_, _ = fmt.Fprintf(l.out, "%s: %s\n", l.tag, msg)
	if l.Journal {
		if path, err := exec.LookPath("logger"); err == nil {
			_ = exec.Command(path, "-t", l.tag, "--", msg).Run()
		}
	}
}

// Kernel writes one line to the kernel log at printk level (3 error, 5 notice), which reaches every console the
// kernel registered, the EC2 serial console of `aws ec2 get-console-output` included. The unit's journal+console
// follows /dev/console, the last console= of the kernel command line, and Fedora 43's aarch64 EC2 images name
// ttyAMA0 there, a PL011 that Graviton does not have (its UART is a 16550, ttyS0, which the kernel still registers
// from the ACPI SPCR table). Best effort: a kernel log that cannot be written loses only this copy.
func (l *Logger) Kernel(level int, msg string) {
	f, err := os.OpenFile(l.kmsg, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return
	}
	defer f.Close()
	if len(msg) > 900 {
		msg = msg[:900]
	}
	_, _ = fmt.Fprintf(f, "<%d>%s: %s\n", level, l.tag, msg)
}

// Version is set at build time (-ldflags "-X main.version=...").
var Version = "devel"

// Failed logs a run's one reason, to the journal and the kernel log (the serial console), and is its exit status.
func Failed(log *Logger, err error) int {
	log.Printf("FAILED: %v", err)
	log.Kernel(3, "FAILED: "+err.Error())
	return 1
}
