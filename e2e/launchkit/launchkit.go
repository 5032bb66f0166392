// Package launchkit is the code the e2e launchers share: kube-testenv (a kube-apiserver and
// an embedded etcd in one process) and kube-node (a single-node cluster in namespaces of its
// own). It writes their credentials (a CA, certificates signed by it, the service-account key,
// bearer tokens, kubeconfigs), waits on the API server, and watches the process that started
// the launcher.
//
// It is a module of its own with no dependencies outside the standard library, so that
// neither launcher's dependencies change: each go.mod requires it at v0.0.0 and replaces it
// with this directory. The launchers' build scripts hash its files with their own.
package launchkit

import (
	"errors"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"
)

// WriteFile writes atomically (a temp file beside it, then a rename) with mode.
func WriteFile(path string, content []byte, mode os.FileMode) error {
	tmp := filepath.Join(filepath.Dir(path), "."+filepath.Base(path)+".tmp")
	if err := os.WriteFile(tmp, content, mode); err != nil {
		return err
	}
	if err := os.Chmod(tmp, mode); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// Signals is the channel a launcher stops on: SIGTERM and SIGINT, and, when parentPID is not 0,
// a SIGTERM once that process is gone (see WatchParent).
func Signals(parentPID int, logf func(format string, args ...any)) chan os.Signal {
	sigCh := make(chan os.Signal, 2)
	signal.Notify(sigCh, syscall.SIGTERM, os.Interrupt)
	if parentPID > 0 {
		go WatchParent(parentPID, sigCh, logf)
	}
	return sigCh
}

// WatchParent sends a SIGTERM-equivalent on sigCh once process pid is gone (checked every
// 250 ms), saying so with logf.
func WatchParent(pid int, sigCh chan<- os.Signal, logf func(format string, args ...any)) {
	for {
		time.Sleep(250 * time.Millisecond)
		if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
			logf("parent process %d is gone; stopping", pid)
			sigCh <- syscall.SIGTERM
			return
		}
	}
}
