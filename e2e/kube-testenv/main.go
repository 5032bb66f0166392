// Command kube-testenv runs a real kube-apiserver and an embedded etcd in one
// process, on 127.0.0.1 only, for end-to-end tests.
//
//	kube-testenv --dir DIR [--port N] [--parent-pid PID] [--etcd-dir PATH] [--reuse-credentials]
//	    [-- extra kube-apiserver flags...]
//
// It writes into DIR: ca.crt, serving.{crt,key}, sa.{key,pub}, tokens.csv,
// admin.token, tester.token, admin.kubeconfig, tester.kubeconfig, and, once
// /readyz answers 200 and the default namespace exists, the marker file
// DIR/ready; then it prints "READY DIR" on stdout. Logs go to stderr.
// SIGTERM or SIGINT stops the apiserver, then etcd, and exits 0 (a signal
// that arrives while it is starting is acted on once the apiserver is up,
// because upstream kube-apiserver exits fatally when stopped mid-start); a
// second signal exits at once.
//
// --parent-pid makes it stop (as on SIGTERM) once that process is gone, so a
// test binary that started it never leaves it behind. --etcd-dir keeps etcd's
// data (and its ports) in PATH across runs, and --reuse-credentials keeps the
// CA, serving certificate, service-account key and tokens found in DIR: with
// both and a fixed --port, stopping and starting again is a restart of the
// same cluster (same objects, resourceVersions keep rising, old kubeconfigs
// still work).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"go.etcd.io/etcd/server/v3/embed"

	genericapiserver "k8s.io/apiserver/pkg/server"
	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/metrics/prometheus/clientgo" // client-go metrics, as in the upstream main
	_ "k8s.io/component-base/metrics/prometheus/version"  // kubernetes_build_info, as in the upstream main
	"k8s.io/kubernetes/cmd/kube-apiserver/app"

	"tenure/e2e/launchkit"
)

const (
	adminUser  = "admin"
	testerUser = "tester"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintf(os.Stderr, "kube-testenv: %v\n", err)
		os.Exit(1)
	}
}

func run() error {
	fs := flag.NewFlagSet("kube-testenv", flag.ExitOnError)
	dirFlag := fs.String("dir", "", "working directory for certs, tokens, kubeconfigs and etcd data (required)")
	port := fs.Int("port", 0, "kube-apiserver secure port on 127.0.0.1 (0 = pick a free one)")
	readyTimeout := fs.Duration("ready-timeout", 150*time.Second, "how long to wait for etcd and then /readyz")
	stopTimeout := fs.Duration("stop-timeout", 60*time.Second, "how long to wait for the apiserver to stop on a signal")
	parentPID := fs.Int("parent-pid", 0, "stop once the process with this pid is gone (0 = never)")
	etcdDirFlag := fs.String("etcd-dir", "", "keep etcd data and ports in this directory across runs (default: a temp dir under DIR, removed on exit)")
	reuseCreds := fs.Bool("reuse-credentials", false, "reuse the CA, serving cert, service-account key and tokens already in DIR")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: kube-testenv --dir DIR [--port N] [--parent-pid PID] [--etcd-dir PATH] [--reuse-credentials] [-- extra kube-apiserver flags]\n")
		fs.PrintDefaults()
	}
	_ = fs.Parse(os.Args[1:])
	if *dirFlag == "" {
		fs.Usage()
		os.Exit(2)
	}
	extraArgs := fs.Args()

	dir, err := filepath.Abs(*dirFlag)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	readyFile := filepath.Join(dir, "ready")
	_ = os.Remove(readyFile)
	defer os.Remove(readyFile)

	// Our own signal handler. The apiserver command installs its own
	// (genericapiserver.SetupSignalContext); it is removed again below, and
	// the apiserver is told to stop with genericapiserver.RequestShutdown.
	sigCh := launchkit.Signals(*parentPID, logf)

	// ---- etcd -------------------------------------------------------------
	var etcdDir string
	keepEtcd := *etcdDirFlag != ""
	if keepEtcd {
		if etcdDir, err = filepath.Abs(*etcdDirFlag); err != nil {
			return err
		}
		if err := os.MkdirAll(etcdDir, 0o700); err != nil {
			return err
		}
	} else {
		if etcdDir, err = os.MkdirTemp(dir, "etcd-"); err != nil {
			return err
		}
		defer os.RemoveAll(etcdDir)
	}

	etcd, etcdURL, err := startEtcd(etcdDir, keepEtcd, *readyTimeout, sigCh)
	if err != nil {
		return err
	}
	if etcd == nil { // signalled while starting
		return nil
	}
	defer closeEtcd(etcd)
	logf("etcd ready at %s", etcdURL)

	// ---- keys, certs, tokens ----------------------------------------------
	caPEM, adminToken, testerToken, reused := []byte(nil), "", "", false
	if *reuseCreds {
		caPEM, adminToken, testerToken, reused = readCredentials(dir)
	}
	if reused {
		logf("reusing the credentials in %s", dir)
	} else {
		if caPEM, err = writeCerts(dir); err != nil {
			return fmt.Errorf("certs: %w", err)
		}
		if err := launchkit.WriteSAKey(dir); err != nil {
			return fmt.Errorf("service account key: %w", err)
		}
		adminToken, testerToken = launchkit.RandToken(), launchkit.RandToken()
		tokens := fmt.Sprintf("%s,%s,%s-uid,\"system:masters\"\n%s,%s,%s-uid\n",
			adminToken, adminUser, adminUser, testerToken, testerUser, testerUser)
		for name, content := range map[string]string{
			"tokens.csv":   tokens,
			"admin.token":  adminToken,
			"tester.token": testerToken,
		} {
			if err := launchkit.WriteFile(filepath.Join(dir, name), []byte(content), 0o600); err != nil {
				return err
			}
		}
	}

	// ---- kube-apiserver ---------------------------------------------------
	if *port == 0 {
		if *port, err = freePort(); err != nil {
			return err
		}
	}
	server := "https://127.0.0.1:" + strconv.Itoa(*port)
	args := []string{
		"--etcd-servers=" + etcdURL,
		"--bind-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(*port),
		"--advertise-address=127.0.0.1",
		"--endpoint-reconciler-type=none",
		"--cert-dir=" + filepath.Join(dir, "apiserver-certs"),
		"--tls-cert-file=" + filepath.Join(dir, "serving.crt"),
		"--tls-private-key-file=" + filepath.Join(dir, "serving.key"),
		"--token-auth-file=" + filepath.Join(dir, "tokens.csv"),
		"--authorization-mode=Node,RBAC",
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file=" + filepath.Join(dir, "sa.pub"),
		"--service-account-signing-key-file=" + filepath.Join(dir, "sa.key"),
		"--service-cluster-ip-range=10.0.0.0/24",
		"--disable-admission-plugins=ServiceAccount",
		"--allow-privileged=true",
		"--profiling=false",
	}
	args = append(args, extraArgs...)

	cmd := app.NewAPIServerCommand()
	// Take SIGTERM/SIGINT back from the apiserver's handler: stopping it in
	// the middle of its start-up makes a post-start hook fail fatally (exit
	// 255, no cleanup), so we decide when to ask it to shut down.
	signal.Reset(syscall.SIGTERM, os.Interrupt)
	signal.Notify(sigCh, syscall.SIGTERM, os.Interrupt)
	// If it never gets going, exit without waiting for a clean stop.
	abort := func(code int) {
		os.Remove(readyFile)
		if !keepEtcd {
			os.RemoveAll(etcdDir)
		}
		os.Exit(code)
	}
	cmd.SetArgs(args)
	apiErr := make(chan error, 1)
	go func() { apiErr <- cli.RunNoErrOutput(cmd) }()
	logf("kube-apiserver starting on %s", server)

	if err := writeKubeconfig(filepath.Join(dir, "admin.kubeconfig"), server, caPEM, adminUser, adminToken); err != nil {
		return err
	}
	if err := writeKubeconfig(filepath.Join(dir, "tester.kubeconfig"), server, caPEM, testerUser, testerToken); err != nil {
		return err
	}

	// ---- readiness --------------------------------------------------------
	api := launchkit.NewAPIClient(server, caPEM, adminToken)
	deadline := time.Now().Add(*readyTimeout)
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	stopRequested := false
	for ready := false; !ready; {
		select {
		case err := <-apiErr:
			if stopRequested {
				logf("kube-apiserver exited while starting: %v", err)
				return nil
			}
			return fmt.Errorf("kube-apiserver exited before ready: %v", err)
		case sig := <-sigCh:
			if stopRequested {
				logf("got %v again, exiting now", sig)
				abort(1)
			}
			logf("got %v while starting; will stop the apiserver once it is up", sig)
			stopRequested = true
			if d := time.Now().Add(*stopTimeout); d.Before(deadline) {
				deadline = d
			}
		case <-tick.C:
		}
		if time.Now().After(deadline) {
			if stopRequested {
				logf("kube-apiserver still not up; exiting without a clean stop")
				abort(0)
			}
			logf("kube-apiserver not ready after %v", *readyTimeout)
			abort(1)
		}
		ready = api.Ready()
	}
	if stopRequested {
		genericapiserver.RequestShutdown()
		return waitAPIServer(apiErr, sigCh, *stopTimeout, abort)
	}
	if err := os.WriteFile(readyFile, []byte(server+"\n"), 0o644); err != nil {
		return err
	}
	logf("ready: %s", server)
	fmt.Printf("READY %s\n", dir)

	// ---- serve until signalled -------------------------------------------
	select {
	case err := <-apiErr:
		return fmt.Errorf("kube-apiserver exited: %v", err)
	case sig := <-sigCh:
		logf("got %v, stopping", sig)
		os.Remove(readyFile)
		genericapiserver.RequestShutdown()
		return waitAPIServer(apiErr, sigCh, *stopTimeout, abort)
	}
}

// waitAPIServer waits for the apiserver to stop after RequestShutdown; a
// second signal aborts.
func waitAPIServer(apiErr <-chan error, sigCh <-chan os.Signal, timeout time.Duration, abort func(int)) error {
	select {
	case sig := <-sigCh:
		logf("got %v again, exiting now", sig)
		abort(1)
	case err := <-apiErr:
		if err != nil && !errors.Is(err, context.Canceled) {
			logf("kube-apiserver stopped with: %v", err)
		} else {
			logf("kube-apiserver stopped")
		}
	case <-time.After(timeout):
		logf("kube-apiserver did not stop within %v; stopping etcd anyway", timeout)
	}
	return nil
}

// startEtcd starts etcd with its data in dataDir. With keep, the data stays
// in dataDir itself and the ports are kept in dataDir/ports, so that a later
// run restarts the same single-member cluster on the same URLs.
func startEtcd(dataDir string, keep bool, timeout time.Duration, sigCh <-chan os.Signal) (*embed.Etcd, string, error) {
	var lastErr error
	portsFile := filepath.Join(dataDir, "ports")
	for attempt := 0; attempt < 5; attempt++ {
		cport, pport, err := 0, 0, error(nil)
		if b, rerr := os.ReadFile(portsFile); keep && rerr == nil {
			if _, err = fmt.Sscanf(string(b), "%d %d", &cport, &pport); err != nil {
				return nil, "", fmt.Errorf("%s: %w", portsFile, err)
			}
		} else {
			if cport, err = freePort(); err != nil {
				return nil, "", err
			}
			if pport, err = freePort(); err != nil {
				return nil, "", err
			}
		}
		curl := url.URL{Scheme: "http", Host: net.JoinHostPort("127.0.0.1", strconv.Itoa(cport))}
		purl := url.URL{Scheme: "http", Host: net.JoinHostPort("127.0.0.1", strconv.Itoa(pport))}

		cfg := embed.NewConfig()
		cfg.Name = "kube-testenv"
		cfg.Dir = filepath.Join(dataDir, strconv.Itoa(attempt))
		if keep {
			cfg.Dir = filepath.Join(dataDir, "data")
		}
		cfg.UnsafeNoFsync = true
		cfg.LogLevel = "error"
		cfg.ListenClientUrls = []url.URL{curl}
		cfg.AdvertiseClientUrls = []url.URL{curl}
		cfg.ListenPeerUrls = []url.URL{purl}
		cfg.AdvertisePeerUrls = []url.URL{purl}
		cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)

		e, err := embed.StartEtcd(cfg)
		if err != nil {
			lastErr = err
			logf("etcd start attempt %d failed: %v", attempt+1, err)
			continue
		}
		select {
		case <-e.Server.ReadyNotify():
			if keep {
				if err := os.WriteFile(portsFile, []byte(fmt.Sprintf("%d %d\n", cport, pport)), 0o600); err != nil {
					e.Close()
					return nil, "", err
				}
			}
			return e, curl.String(), nil
		case err := <-e.Err():
			e.Close()
			return nil, "", fmt.Errorf("etcd failed: %w", err)
		case sig := <-sigCh:
			logf("got %v while starting etcd", sig)
			e.Close()
			return nil, "", nil
		case <-time.After(timeout):
			e.Close()
			return nil, "", fmt.Errorf("etcd not ready after %v", timeout)
		}
	}
	return nil, "", fmt.Errorf("etcd: %w", lastErr)
}

// readCredentials reads the CA and the tokens an earlier run wrote into dir;
// ok is false if any file is missing.
func readCredentials(dir string) (caPEM []byte, admin, tester string, ok bool) {
	for _, f := range []string{"serving.crt", "serving.key", "sa.key", "sa.pub", "tokens.csv"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			return nil, "", "", false
		}
	}
	caPEM, err := os.ReadFile(filepath.Join(dir, "ca.crt"))
	if err != nil {
		return nil, "", "", false
	}
	a, err1 := os.ReadFile(filepath.Join(dir, "admin.token"))
	t, err2 := os.ReadFile(filepath.Join(dir, "tester.token"))
	if err1 != nil || err2 != nil {
		return nil, "", "", false
	}
	return caPEM, string(a), string(t), true
}

func closeEtcd(e *embed.Etcd) {
	done := make(chan struct{})
	go func() { e.Close(); close(done) }()
	select {
	case <-done:
		logf("etcd stopped")
	case <-time.After(20 * time.Second):
		logf("etcd did not stop within 20s")
	}
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// writeCerts writes ca.crt and a serving cert/key for 127.0.0.1 and
// localhost signed by it (the CA key is never written). Returns the CA PEM.
func writeCerts(dir string) ([]byte, error) {
	ca, err := launchkit.NewCA("kube-testenv-ca")
	if err != nil {
		return nil, err
	}
	if err := launchkit.WriteFile(filepath.Join(dir, "ca.crt"), ca.PEM, 0o644); err != nil {
		return nil, err
	}
	return ca.PEM, ca.Issue(dir, "serving", "kube-apiserver", nil, true, []string{"127.0.0.1"}, []string{"localhost"})
}

func writeKubeconfig(path, server string, caPEM []byte, user, token string) error {
	return launchkit.Kubeconfig{Cluster: "kube-testenv", Server: server, CAPEM: caPEM, User: user, Token: token}.Write(path)
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "kube-testenv: "+format+"\n", args...)
}
