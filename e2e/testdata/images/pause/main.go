// Command pause stands in for registry.k8s.io/pause (kubernetes/kubernetes build/pause/linux/pause.c, which cannot
// be pulled here): a pod sandbox's first process, which holds the pod's namespaces, reaps the orphans the pod's
// other processes leave to it (it is their PID 1 when the pod shares its PID namespace) and exits on SIGINT or
// SIGTERM, as the upstream program does.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for s := range sigs {
		if s != syscall.SIGCHLD {
			os.Exit(0)
		}
		reap()
	}
}

// reap collects every child that has exited, without blocking.
func reap() {
	for {
		pid, err := syscall.Wait4(-1, nil, syscall.WNOHANG, nil)
		if pid <= 0 || err != nil {
			return
		}
	}
}
