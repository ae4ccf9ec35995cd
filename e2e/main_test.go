//go:build e2e

package e2e

import (
	"bufio"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/dynk8s/dynk8s/node/nodetest"
)

// netHelperEnv makes the test binary a small TCP endpoint instead of a test run, so that the tunnel tests can
// start it inside a network namespace with `ip netns exec NS <test binary> serve|send ...`: a process cannot enter
// a namespace for one goroutine without pinning and later killing its thread, and a killed thread would take with
// it every child started with Pdeathsig from that thread.
const netHelperEnv = "DYNK8S_E2E_NET_HELPER"

// helperDeadline bounds every helper process.
const helperDeadline = 30 * time.Second

func TestMain(m *testing.M) {
	if os.Getenv(netHelperEnv) != "" {
		os.Exit(netHelper(os.Args[1:]))
	}
	code := m.Run()
	nodetest.RemoveBuiltAgent()
	removeBuiltController()
	removePackageRepos()
	os.Exit(code)
}

// netHelper runs one helper command and returns its exit code:
//
//	serve ADDR      listen on ADDR, print "listening", accept one connection, read it to EOF, answer and print
//	                "<sha256 hex> <bytes>" of what it read
//	send ADDR N     connect to ADDR, send N random bytes, half-close, print "<sha256 hex> <bytes>" of what it sent,
//	                then the server's answer on a second line (N=0: only the handshake)
func netHelper(args []string) int {
	if err := runNetHelper(args); err != nil {
		fmt.Fprintln(os.Stderr, "net helper:", err)
		return 1
	}
	return 0
}

func runNetHelper(args []string) error {
	if len(args) < 2 {
		return fmt.Errorf("usage: serve ADDR | send ADDR N, got %q", args)
	}
	deadline := time.Now().Add(helperDeadline)
	switch args[0] {
	case "serve":
		l, err := net.Listen("tcp", args[1])
		if err != nil {
			return err
		}
		defer l.Close()
		fmt.Println("listening")
		_ = l.(*net.TCPListener).SetDeadline(deadline)
		c, err := l.Accept()
		if err != nil {
			return err
		}
		defer c.Close()
		_ = c.SetDeadline(deadline)
		sum, n, err := digest(c)
		if err != nil {
			return err
		}
		answer := fmt.Sprintf("%s %d", sum, n)
		if _, err := io.WriteString(c, answer+"\n"); err != nil {
			return err
		}
		fmt.Println(answer)
		return nil
	case "send":
		if len(args) != 3 {
			return fmt.Errorf("usage: send ADDR N")
		}
		n, err := strconv.ParseInt(args[2], 10, 64)
		if err != nil {
			return err
		}
		c, err := net.DialTimeout("tcp", args[1], 5*time.Second)
		if err != nil {
			return err
		}
		defer c.Close()
		_ = c.SetDeadline(deadline)
		h := sha256.New()
		sent, err := io.Copy(io.MultiWriter(c, h), io.LimitReader(rand.Reader, n))
		if err != nil {
			return err
		}
		if err := c.(*net.TCPConn).CloseWrite(); err != nil {
			return err
		}
		fmt.Printf("%s %d\n", hex.EncodeToString(h.Sum(nil)), sent)
		answer, err := bufio.NewReader(c).ReadString('\n')
		if err != nil {
			return fmt.Errorf("reading the server's answer: %w", err)
		}
		fmt.Print(answer)
		return nil
	}
	return fmt.Errorf("unknown helper command %q", args[0])
}

func digest(r io.Reader) (string, int64, error) {
	h := sha256.New()
	n, err := io.Copy(h, r)
	return hex.EncodeToString(h.Sum(nil)), n, err
}
