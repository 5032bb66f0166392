// Command kube-node runs a real single-node Kubernetes cluster for end-to-end tests:
// etcd (embedded), kube-apiserver, kube-controller-manager, kube-scheduler, containerd
// (Debian's, with runc and the CNI plugins) and a kubelet, all inside a network, a mount and
// a PID namespace this command creates.
//
//	kube-node --dir DIR --bin-dir BINDIR [--parent-pid PID] [--port N] [--image ARCHIVE]...
//
// The outer process stays in the host's namespaces. It writes certificates, kubeconfigs and
// configuration into DIR, creates the node's cgroup root (tenure-node-<pid> in every cgroup
// v1 hierarchy), and starts itself again as the PID 1 of new namespaces ("inner"). The
// inner process mounts tmpfs over /run, /var/lib and /var/log and bind-mounts files over
// the /proc/sys entries the kubelet would otherwise write, so every path the components
// write outside DIR lives only in that mount namespace; it brings up the node's network
// (loopback and a veth pair, both ends inside, with the node address 198.18.0.1; pods get 198.18.1.0/24
// on a bridge; the Service range is 198.18.2.0/24, and nftables sends the `kubernetes`
// Service address to the API server, standing in for kube-proxy) and starts the components.
// No interface leads out of the namespace, so no packet of the cluster can leave it.
//
// The outer process relays 127.0.0.1:PORT on the host to the API server inside, writes
// admin.kubeconfig and tester.kubeconfig for that address, and once the node is Ready
// writes DIR/ready (the server URL and the inner PID) and prints "READY DIR".
//
// SIGTERM, SIGINT or the end of --parent-pid stops everything: the inner process, as the
// PID 1 of its namespace, takes every process of the cluster with it (pods, shims,
// containerd); the outer one then removes the cgroups and exits. A cgroup root left by a
// run that was killed is removed by the next run. Nothing stays on the host.
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
	"golang.org/x/sys/unix"

	"tenure/e2e/launchkit"
)

const (
	nodeName    = "tenure-node"
	nodeIP      = "198.18.0.1"
	podCIDR     = "198.18.1.0/24"
	podGateway  = "198.18.1.1"
	serviceCIDR = "198.18.2.0/24"
	serviceIP   = "198.18.2.1" // the `kubernetes` Service
	apiPort     = 6443
	cgroupBase  = "/sys/fs/cgroup"
	cgroupName  = "tenure-node-"
	// Inside the mount namespace only (tmpfs).
	containerdSock = "/run/containerd/containerd.sock"
	kubeletRoot    = "/var/lib/kubelet"
	// What the kubelet writes into /proc/sys at start (kubelet's setupKernelTunables), and
	// the values it wants: files holding them are bind-mounted over these entries.
	pauseImage = "registry.k8s.io/pause:3.10"
)

var kernelTunables = map[string]string{
	"vm/overcommit_memory":      "1",
	"vm/panic_on_oom":           "0",
	"kernel/panic":              "10",
	"kernel/panic_on_oops":      "1",
	"kernel/keys/root_maxkeys":  "1000000",
	"kernel/keys/root_maxbytes": "25000000",
}

func main() {
	var err error
	if len(os.Args) > 1 && os.Args[1] == "__inner" {
		err = inner(os.Args[2:])
	} else {
		err = outer(os.Args[1:])
	}
	if err != nil {
		logf("%v", err)
		os.Exit(1)
	}
}

// ---------------------------------------------------------------------------------------
// outer: the host side

type imageList []string

func (l *imageList) String() string     { return strings.Join(*l, ",") }
func (l *imageList) Set(v string) error { *l = append(*l, v); return nil }

func outer(argv []string) error {
	fs := flag.NewFlagSet("kube-node", flag.ExitOnError)
	dirFlag := fs.String("dir", "", "working directory: certificates, configuration, logs (required)")
	binDir := fs.String("bin-dir", "", "directory with kube-apiserver, kube-controller-manager, kube-scheduler, kubelet (required)")
	parentPID := fs.Int("parent-pid", 0, "stop once the process with this pid is gone (0 = never)")
	port := fs.Int("port", 0, "host port on 127.0.0.1 relayed to the API server (0 = a free one)")
	readyTimeout := fs.Duration("ready-timeout", 180*time.Second, "how long to wait for a Ready node")
	var images imageList
	fs.Var(&images, "image", "an image archive (docker-archive or oci-archive) to import into containerd before the kubelet starts; repeatable")
	_ = fs.Parse(argv)
	if *dirFlag == "" || *binDir == "" {
		fs.Usage()
		os.Exit(2)
	}
	dir, err := filepath.Abs(*dirFlag)
	if err != nil {
		return err
	}
	bins, err := filepath.Abs(*binDir)
	if err != nil {
		return err
	}
	for _, b := range []string{"kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet"} {
		if _, err := os.Stat(filepath.Join(bins, b)); err != nil {
			return fmt.Errorf("missing binary: %w", err)
		}
	}
	for _, tool := range []string{"containerd", "containerd-shim-runc-v2", "runc", "ctr", "ip", "nft"} {
		if _, err := exec.LookPath(tool); err != nil {
			return fmt.Errorf("%s not found on PATH (Debian packages containerd, runc, iproute2, nftables)", tool)
		}
	}
	if _, err := os.Stat("/usr/lib/cni/bridge"); err != nil {
		return fmt.Errorf("no CNI plugins in /usr/lib/cni (Debian package containernetworking-plugins)")
	}
	for i, img := range images {
		if images[i], err = filepath.Abs(img); err != nil {
			return err
		}
	}
	if err := os.MkdirAll(filepath.Join(dir, "logs"), 0o755); err != nil {
		return err
	}
	readyFile := filepath.Join(dir, "ready")
	_ = os.Remove(readyFile)
	defer os.Remove(readyFile)

	sigCh := launchkit.Signals(*parentPID, logf)

	removeStaleCgroups()
	cgroupRoot := cgroupName + strconv.Itoa(os.Getpid())
	if err := makeCgroupRoot(cgroupRoot); err != nil {
		removeCgroupRoot(cgroupRoot)
		return err
	}
	defer removeCgroupRoot(cgroupRoot)

	// Relay listener first: its port goes into the kubeconfigs.
	ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(*port)))
	if err != nil {
		return err
	}
	defer ln.Close()
	hostURL := "https://" + ln.Addr().String()

	if err := writeCluster(dir, hostURL, cgroupRoot); err != nil {
		return err
	}

	self, err := os.Executable()
	if err != nil {
		return err
	}
	args := []string{"__inner", "--dir", dir, "--bin-dir", bins, "--ready-timeout", readyTimeout.String()}
	for _, img := range images {
		args = append(args, "--image", img)
	}
	logFile, err := os.OpenFile(filepath.Join(dir, "logs", "inner.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer logFile.Close()
	// The child is created from a thread that stays alive for as long as this process
	// (Pdeathsig follows the creating thread).
	runtime.LockOSThread()
	cmd := exec.Command(self, args...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags: syscall.CLONE_NEWNET | syscall.CLONE_NEWNS | syscall.CLONE_NEWPID,
		Pdeathsig:  syscall.SIGKILL,
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("cannot start the node's namespaces (needs root): %w", err)
	}
	innerPID := cmd.Process.Pid
	logf("inner pid %d, relay %s", innerPID, hostURL)
	innerDone := make(chan error, 1)
	go func() { innerDone <- cmd.Wait() }()

	stop := func(why string) error {
		logf("stopping: %s", why)
		os.Remove(readyFile)
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-innerDone:
		case <-time.After(20 * time.Second):
			logf("inner process still running 20s after SIGTERM; SIGKILL")
			_ = cmd.Process.Kill()
			<-innerDone
		}
		return nil
	}

	netns, err := os.Open(fmt.Sprintf("/proc/%d/ns/net", innerPID))
	if err != nil {
		_ = stop("cannot open the node's network namespace")
		return err
	}
	defer netns.Close()
	dialer, err := newNetnsDialer(netns)
	if err != nil {
		_ = stop("cannot enter the node's network namespace")
		return err
	}
	go relay(ln, dialer, net.JoinHostPort("127.0.0.1", strconv.Itoa(apiPort)))

	innerReady := filepath.Join(dir, "inner-ready")
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case err := <-innerDone:
			tail(filepath.Join(dir, "logs", "inner.log"), 40)
			return fmt.Errorf("the node exited before it was ready: %v (logs in %s)", err, filepath.Join(dir, "logs"))
		case sig := <-sigCh:
			return stop(fmt.Sprintf("got %v while starting", sig))
		case <-tick.C:
		}
		if _, err := os.Stat(innerReady); err == nil {
			break
		}
	}
	content := fmt.Sprintf("%s\n%d\n", hostURL, innerPID)
	if err := os.WriteFile(readyFile, []byte(content), 0o644); err != nil {
		_ = stop("cannot write the ready file")
		return err
	}
	logf("ready: %s (inner pid %d)", hostURL, innerPID)
	fmt.Printf("READY %s\n", dir)

	select {
	case err := <-innerDone:
		return fmt.Errorf("the node exited: %v (logs in %s)", err, filepath.Join(dir, "logs"))
	case sig := <-sigCh:
		return stop(fmt.Sprintf("got %v", sig))
	}
}

// netnsDialer dials TCP connections from inside another network namespace: one goroutine,
// locked to an OS thread that entered the namespace, creates every socket (a socket stays in
// the namespace it was created in).
type netnsDialer struct {
	reqs chan dialReq
}

type dialReq struct {
	addr  string
	reply chan dialResult
}

type dialResult struct {
	conn net.Conn
	err  error
}

func newNetnsDialer(ns *os.File) (*netnsDialer, error) {
	d := &netnsDialer{reqs: make(chan dialReq)}
	errCh := make(chan error, 1)
	go func() {
		// Never unlocked: the thread dies with the goroutine, not back in the pool.
		runtime.LockOSThread()
		if err := unix.Setns(int(ns.Fd()), unix.CLONE_NEWNET); err != nil {
			errCh <- err
			return
		}
		errCh <- nil
		for req := range d.reqs {
			c, err := net.DialTimeout("tcp", req.addr, 5*time.Second)
			req.reply <- dialResult{c, err}
		}
	}()
	return d, <-errCh
}

func (d *netnsDialer) dial(addr string) (net.Conn, error) {
	reply := make(chan dialResult, 1)
	d.reqs <- dialReq{addr, reply}
	r := <-reply
	return r.conn, r.err
}

func relay(ln net.Listener, d *netnsDialer, target string) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			up, err := d.dial(target)
			if err != nil {
				return
			}
			defer up.Close()
			done := make(chan struct{}, 2)
			go func() { _, _ = io.Copy(up, c); closeWrite(up); done <- struct{}{} }()
			go func() { _, _ = io.Copy(c, up); closeWrite(c); done <- struct{}{} }()
			<-done
			<-done
		}()
	}
}

func closeWrite(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.CloseWrite()
	}
}

// ---- cgroups (v1: one directory per hierarchy) -------------------------------------------

func cgroupHierarchies() []string {
	entries, err := os.ReadDir(cgroupBase)
	if err != nil {
		return nil
	}
	var out []string
	for _, e := range entries {
		p := filepath.Join(cgroupBase, e.Name())
		if fi, err := os.Lstat(p); err == nil && fi.IsDir() {
			if _, err := os.Stat(filepath.Join(p, "cgroup.procs")); err == nil {
				out = append(out, p)
			}
		}
	}
	return out
}

func makeCgroupRoot(name string) error {
	hs := cgroupHierarchies()
	if len(hs) == 0 {
		return fmt.Errorf("no cgroup v1 hierarchies under %s (a cgroup v2 host is not supported yet)", cgroupBase)
	}
	for _, h := range hs {
		p := filepath.Join(h, name)
		if err := os.Mkdir(p, 0o755); err != nil && !os.IsExist(err) {
			return fmt.Errorf("cgroup %s: %w", p, err)
		}
		if filepath.Base(h) == "cpuset" {
			for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
				b, err := os.ReadFile(filepath.Join(h, f))
				if err != nil {
					return err
				}
				if err := os.WriteFile(filepath.Join(p, f), b, 0o644); err != nil {
					return fmt.Errorf("%s: %w", filepath.Join(p, f), err)
				}
			}
		}
	}
	return nil
}

// removeCgroupRoot kills what is left in the tree (nothing, normally: the PID namespace is
// gone) and removes it, deepest first.
func removeCgroupRoot(name string) {
	for _, h := range cgroupHierarchies() {
		root := filepath.Join(h, name)
		if _, err := os.Stat(root); err != nil {
			continue
		}
		var dirs []string
		_ = filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
		sort.Slice(dirs, func(i, j int) bool { return len(dirs[i]) > len(dirs[j]) })
		for attempt := 0; attempt < 50; attempt++ {
			left := 0
			for _, d := range dirs {
				if b, err := os.ReadFile(filepath.Join(d, "cgroup.procs")); err == nil {
					for _, f := range strings.Fields(string(b)) {
						if pid, err := strconv.Atoi(f); err == nil {
							_ = syscall.Kill(pid, syscall.SIGKILL)
						}
					}
				}
				if err := os.Remove(d); err != nil && !os.IsNotExist(err) {
					left++
				}
			}
			if left == 0 {
				break
			}
			// A frozen cgroup keeps its processes: thaw it so SIGKILL can land.
			for _, d := range dirs {
				_ = os.WriteFile(filepath.Join(d, "freezer.state"), []byte("THAWED"), 0o644)
			}
			time.Sleep(100 * time.Millisecond)
		}
		if _, err := os.Stat(root); err == nil {
			logf("could not remove cgroup %s", root)
		}
	}
}

// removeStaleCgroups removes the cgroup roots of earlier runs whose outer process is gone.
func removeStaleCgroups() {
	seen := map[string]bool{}
	for _, h := range cgroupHierarchies() {
		entries, _ := os.ReadDir(h)
		for _, e := range entries {
			if !e.IsDir() || !strings.HasPrefix(e.Name(), cgroupName) || seen[e.Name()] {
				continue
			}
			seen[e.Name()] = true
			pid, err := strconv.Atoi(strings.TrimPrefix(e.Name(), cgroupName))
			if err == nil && isKubeNode(pid) {
				continue
			}
			logf("removing the cgroups of an earlier run: %s", e.Name())
			removeCgroupRoot(e.Name())
		}
	}
}

func isKubeNode(pid int) bool {
	if pid <= 0 || syscall.Kill(pid, 0) != nil {
		return false
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	return err == nil && strings.Contains(string(b), "kube-node")
}

// ---- certificates and configuration ------------------------------------------------------

func writeCluster(dir, hostURL, cgroupRoot string) error {
	pki := filepath.Join(dir, "pki")
	if err := os.MkdirAll(pki, 0o755); err != nil {
		return err
	}
	c, err := launchkit.NewCA("kube-node-ca")
	if err != nil {
		return err
	}
	if err := launchkit.WriteFile(filepath.Join(dir, "ca.crt"), c.PEM, 0o644); err != nil {
		return err
	}
	if err := c.Issue(pki, "apiserver", "kube-apiserver", nil, true,
		[]string{"127.0.0.1", nodeIP, serviceIP},
		[]string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"}); err != nil {
		return err
	}
	if err := c.Issue(pki, "kubelet-serving", nodeName, nil, true, []string{nodeIP}, []string{nodeName}); err != nil {
		return err
	}
	clients := []struct{ name, cn, org string }{
		{"kubelet", "system:node:" + nodeName, "system:nodes"},
		{"controller-manager", "system:kube-controller-manager", ""},
		{"scheduler", "system:kube-scheduler", ""},
		{"apiserver-kubelet-client", "kube-apiserver-kubelet-client", "system:masters"},
	}
	for _, cl := range clients {
		var orgs []string
		if cl.org != "" {
			orgs = []string{cl.org}
		}
		if err := c.Issue(pki, cl.name, cl.cn, orgs, false, nil, nil); err != nil {
			return err
		}
	}
	if err := launchkit.WriteSAKey(pki); err != nil {
		return err
	}
	adminToken, testerToken := launchkit.RandToken(), launchkit.RandToken()
	tokens := fmt.Sprintf("%s,admin,admin-uid,\"system:masters\"\n%s,tester,tester-uid\n", adminToken, testerToken)
	if err := launchkit.WriteFile(filepath.Join(pki, "tokens.csv"), []byte(tokens), 0o600); err != nil {
		return err
	}
	if err := launchkit.WriteFile(filepath.Join(dir, "admin.token"), []byte(adminToken), 0o600); err != nil {
		return err
	}
	if err := launchkit.WriteFile(filepath.Join(dir, "tester.token"), []byte(testerToken), 0o600); err != nil {
		return err
	}
	// Host side: through the relay.
	if err := writeKubeconfig(filepath.Join(dir, "admin.kubeconfig"), hostURL, c.PEM, "admin", adminToken, "", ""); err != nil {
		return err
	}
	if err := writeKubeconfig(filepath.Join(dir, "tester.kubeconfig"), hostURL, c.PEM, "tester", testerToken, "", ""); err != nil {
		return err
	}
	// Inside the node's network namespace.
	inURL := "https://127.0.0.1:" + strconv.Itoa(apiPort)
	if err := writeKubeconfig(filepath.Join(dir, "inner-admin.kubeconfig"), inURL, c.PEM, "admin", adminToken, "", ""); err != nil {
		return err
	}
	for _, cl := range clients[:3] {
		if err := writeKubeconfig(filepath.Join(dir, cl.name+".kubeconfig"), inURL, c.PEM, cl.cn, "",
			filepath.Join(pki, cl.name+".crt"), filepath.Join(pki, cl.name+".key")); err != nil {
			return err
		}
	}
	return writeConfigs(dir, cgroupRoot)
}

func writeConfigs(dir, cgroupRoot string) error {
	pki := filepath.Join(dir, "pki")
	containerd := fmt.Sprintf(`version = 2
root = "/var/lib/containerd"
state = "/run/containerd"
disabled_plugins = [
  "io.containerd.snapshotter.v1.aufs",
  "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.snapshotter.v1.zfs",
  "io.containerd.tracing.processor.v1.otlp",
  "io.containerd.internal.v1.tracing",
]

[grpc]
  address = %q

[plugins."io.containerd.internal.v1.opt"]
  path = "/var/lib/containerd-opt"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = %q
  restrict_oom_score_adj = true
  disable_apparmor = true
  netns_mounts_under_state_dir = true
  enable_selinux = false
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = %q
`, containerdSock, pauseImage, filepath.Join(dir, "cni"))
	cni := fmt.Sprintf(`{
  "cniVersion": "0.4.0",
  "name": "tenure-node",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "cni0",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "dataDir": "/var/lib/cni/networks",
        "ranges": [[{"subnet": %q, "gateway": %q}]],
        "routes": [{"dst": "0.0.0.0/0"}]
      }
    },
    {"type": "loopback"}
  ]
}
`, podCIDR, podGateway)
	kubelet := fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupsPerQOS: true
cgroupRoot: /%s
enforceNodeAllocatable: [pods]
failSwapOn: false
makeIPTablesUtilChains: false
protectKernelDefaults: false
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard:
  nodefs.available: "1%%"
  nodefs.inodesFree: "1%%"
  imagefs.available: "1%%"
  memory.available: "50Mi"
address: %s
port: 10250
readOnlyPort: 0
healthzPort: 0
tlsCertFile: %s
tlsPrivateKeyFile: %s
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: %s}
authorization:
  mode: Webhook
containerRuntimeEndpoint: unix://%s
resolvConf: %s
clusterDomain: cluster.local
clusterDNS: [%s]
registerNode: true
serializeImagePulls: false
maxPods: 30
nodeStatusUpdateFrequency: 4s
syncFrequency: 10s
`, cgroupRoot, nodeIP, filepath.Join(pki, "kubelet-serving.crt"), filepath.Join(pki, "kubelet-serving.key"),
		filepath.Join(dir, "ca.crt"), containerdSock, filepath.Join(dir, "resolv.conf"), nodeIP)
	files := map[string]string{
		"containerd.toml":             containerd,
		"cni/10-tenure-node.conflist": cni,
		"kubelet.yaml":                kubelet,
		// No DNS server: pods resolve nothing (every address in the tests is an IP).
		"resolv.conf": "nameserver " + nodeIP + "\noptions timeout:1 attempts:1\n",
	}
	for name, content := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		if err := launchkit.WriteFile(p, []byte(content), 0o644); err != nil {
			return err
		}
	}
	sys := filepath.Join(dir, "sysctl")
	if err := os.MkdirAll(sys, 0o755); err != nil {
		return err
	}
	for k, v := range kernelTunables {
		if err := launchkit.WriteFile(filepath.Join(sys, strings.ReplaceAll(k, "/", ".")), []byte(v+"\n"), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// ---------------------------------------------------------------------------------------
// inner: PID 1 of the node's namespaces

type proc struct {
	name string
	cmd  *exec.Cmd
	done chan struct{}
	code int
}

type supervisor struct {
	mu    sync.Mutex
	procs map[int]*proc
	order []*proc
}

func inner(argv []string) error {
	fs := flag.NewFlagSet("kube-node __inner", flag.ExitOnError)
	dirFlag := fs.String("dir", "", "")
	binDir := fs.String("bin-dir", "", "")
	readyTimeout := fs.Duration("ready-timeout", 180*time.Second, "")
	var images imageList
	fs.Var(&images, "image", "")
	_ = fs.Parse(argv)
	dir, bins := *dirFlag, *binDir
	logs := filepath.Join(dir, "logs")

	sigCh := launchkit.Signals(0, logf)
	sup := &supervisor{procs: map[int]*proc{}}
	go sup.reap()

	if err := setupMounts(dir); err != nil {
		return fmt.Errorf("mounts: %w", err)
	}
	if err := setupNetwork(sup); err != nil {
		return fmt.Errorf("network: %w", err)
	}

	// etcd, in this process.
	etcdCfg := embed.NewConfig()
	etcdCfg.Name = "kube-node"
	etcdCfg.Dir = "/var/lib/etcd"
	etcdCfg.UnsafeNoFsync = true
	etcdCfg.LogLevel = "error"
	etcdCfg.LogOutputs = []string{filepath.Join(logs, "etcd.log")}
	cu, _ := url.Parse("http://127.0.0.1:2379")
	pu, _ := url.Parse("http://127.0.0.1:2380")
	etcdCfg.ListenClientUrls, etcdCfg.AdvertiseClientUrls = []url.URL{*cu}, []url.URL{*cu}
	etcdCfg.ListenPeerUrls, etcdCfg.AdvertisePeerUrls = []url.URL{*pu}, []url.URL{*pu}
	etcdCfg.InitialCluster = etcdCfg.InitialClusterFromName(etcdCfg.Name)
	etcd, err := embed.StartEtcd(etcdCfg)
	if err != nil {
		return fmt.Errorf("etcd: %w", err)
	}
	select {
	case <-etcd.Server.ReadyNotify():
	case <-time.After(60 * time.Second):
		return fmt.Errorf("etcd not ready after 60s")
	}
	logf("etcd ready")

	pki := filepath.Join(dir, "pki")
	deadline := time.Now().Add(*readyTimeout)
	start := func(name string, path string, args ...string) error {
		return sup.start(name, filepath.Join(logs, name+".log"), path, args...)
	}
	if err := start("kube-apiserver", filepath.Join(bins, "kube-apiserver"),
		"--etcd-servers=http://127.0.0.1:2379",
		"--bind-address=0.0.0.0",
		"--secure-port="+strconv.Itoa(apiPort),
		"--advertise-address="+nodeIP,
		"--cert-dir="+filepath.Join(dir, "apiserver-certs"),
		"--tls-cert-file="+filepath.Join(pki, "apiserver.crt"),
		"--tls-private-key-file="+filepath.Join(pki, "apiserver.key"),
		"--client-ca-file="+filepath.Join(dir, "ca.crt"),
		"--token-auth-file="+filepath.Join(pki, "tokens.csv"),
		"--authorization-mode=Node,RBAC",
		"--enable-admission-plugins=NodeRestriction",
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file="+filepath.Join(pki, "sa.pub"),
		"--service-account-signing-key-file="+filepath.Join(pki, "sa.key"),
		"--service-cluster-ip-range="+serviceCIDR,
		"--kubelet-client-certificate="+filepath.Join(pki, "apiserver-kubelet-client.crt"),
		"--kubelet-client-key="+filepath.Join(pki, "apiserver-kubelet-client.key"),
		"--kubelet-preferred-address-types=InternalIP",
		"--allow-privileged=true",
		"--profiling=false",
	); err != nil {
		return err
	}
	adminToken, err := os.ReadFile(filepath.Join(dir, "admin.token"))
	if err != nil {
		return err
	}
	caPEM, err := os.ReadFile(filepath.Join(dir, "ca.crt"))
	if err != nil {
		return err
	}
	api := launchkit.NewAPIClient("https://127.0.0.1:"+strconv.Itoa(apiPort), caPEM, string(adminToken))
	if err := waitFor(deadline, sigCh, "kube-apiserver /readyz", api.Ready); err != nil {
		return sup.shutdown(err, etcd)
	}
	logf("kube-apiserver ready")

	if err := start("kube-controller-manager", filepath.Join(bins, "kube-controller-manager"),
		"--kubeconfig="+filepath.Join(dir, "controller-manager.kubeconfig"),
		"--leader-elect=false",
		"--secure-port=0",
		"--root-ca-file="+filepath.Join(dir, "ca.crt"),
		"--service-account-private-key-file="+filepath.Join(pki, "sa.key"),
		"--use-service-account-credentials=true",
		"--profiling=false",
	); err != nil {
		return sup.shutdown(err, etcd)
	}
	if err := start("kube-scheduler", filepath.Join(bins, "kube-scheduler"),
		"--kubeconfig="+filepath.Join(dir, "scheduler.kubeconfig"),
		"--leader-elect=false",
		"--secure-port=0",
		"--profiling=false",
	); err != nil {
		return sup.shutdown(err, etcd)
	}
	if err := start("containerd", "containerd", "--config", filepath.Join(dir, "containerd.toml")); err != nil {
		return sup.shutdown(err, etcd)
	}
	if err := waitFor(deadline, sigCh, "containerd", func() bool {
		_, err := sup.run("", "ctr", "--address", containerdSock, "version")
		return err == nil
	}); err != nil {
		return sup.shutdown(err, etcd)
	}
	for _, img := range images {
		out, err := sup.run("", "ctr", "--address", containerdSock, "-n", "k8s.io", "images", "import", img)
		if err != nil {
			return sup.shutdown(fmt.Errorf("ctr images import %s: %v: %s", img, err, out), etcd)
		}
		logf("imported %s: %s", img, strings.TrimSpace(string(out)))
	}
	if err := start("kubelet", filepath.Join(bins, "kubelet"),
		"--config="+filepath.Join(dir, "kubelet.yaml"),
		"--kubeconfig="+filepath.Join(dir, "kubelet.kubeconfig"),
		"--root-dir="+kubeletRoot,
		"--hostname-override="+nodeName,
		"--node-ip="+nodeIP,
		"--v=1",
	); err != nil {
		return sup.shutdown(err, etcd)
	}
	if err := waitFor(deadline, sigCh, "a Ready node", func() bool { return nodeReady(api, nodeName) }); err != nil {
		return sup.shutdown(err, etcd)
	}
	// The default ServiceAccount exists once the controller-manager runs; pods need it.
	if err := waitFor(deadline, sigCh, "the default ServiceAccount", func() bool {
		return api.Status("/api/v1/namespaces/default/serviceaccounts/default") == http.StatusOK
	}); err != nil {
		return sup.shutdown(err, etcd)
	}
	if err := launchkit.WriteFile(filepath.Join(dir, "inner-ready"), []byte("ready\n"), 0o644); err != nil {
		return sup.shutdown(err, etcd)
	}
	logf("node %s Ready", nodeName)

	exited := sup.anyExit()
	select {
	case sig := <-sigCh:
		return sup.shutdown(fmt.Errorf("got %v", sig), etcd)
	case p := <-exited:
		return sup.shutdown(fmt.Errorf("%s exited with status %d", p.name, p.code), etcd)
	}
}

func waitFor(deadline time.Time, sigCh <-chan os.Signal, what string, ok func() bool) error {
	for !ok() {
		select {
		case sig := <-sigCh:
			return fmt.Errorf("got %v while waiting for %s", sig, what)
		case <-time.After(200 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no %s before the deadline", what)
		}
	}
	return nil
}

// setupMounts makes this mount namespace private and puts everything the components write
// outside DIR on tmpfs here.
func setupMounts(dir string) error {
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make / private: %w", err)
	}
	// A /proc for this PID namespace.
	if err := unix.Mount("proc", "/proc", "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("mount /proc: %w", err)
	}
	for _, p := range []string{"/run", "/var/lib", "/var/log"} {
		if err := unix.Mount("tmpfs", p, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=755"); err != nil {
			return fmt.Errorf("tmpfs on %s: %w", p, err)
		}
	}
	// /var/run is usually a link to /run; make sure it resolves here.
	for k := range kernelTunables {
		src := filepath.Join(dir, "sysctl", strings.ReplaceAll(k, "/", "."))
		dst := filepath.Join("/proc/sys", k)
		if _, err := os.Stat(dst); err != nil {
			continue
		}
		if err := unix.Mount(src, dst, "", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("bind %s over %s: %w", src, dst, err)
		}
	}
	return nil
}

func setupNetwork(s *supervisor) error {
	cmds := [][]string{
		{"ip", "link", "set", "lo", "up"},
		// A veth pair with both ends here (no dummy module on every kernel): the node's
		// address on one end, nothing leads out of the namespace.
		{"ip", "link", "add", "node0", "type", "veth", "peer", "name", "node0p"},
		{"ip", "addr", "add", nodeIP + "/24", "dev", "node0"},
		{"ip", "link", "set", "node0", "up"},
		{"ip", "link", "set", "node0p", "up"},
	}
	for _, c := range cmds {
		if out, err := s.run("", c[0], c[1:]...); err != nil {
			return fmt.Errorf("%v: %s", err, out)
		}
	}
	// kube-proxy's one job here: the `kubernetes` Service address reaches the API server.
	rules := fmt.Sprintf(`table ip kube_node {
  chain prerouting {
    type nat hook prerouting priority dstnat; policy accept;
    ip daddr %[1]s tcp dport 443 dnat to %[2]s:%[3]d
  }
  chain output {
    type nat hook output priority -100; policy accept;
    ip daddr %[1]s tcp dport 443 dnat to %[2]s:%[3]d
  }
}
`, serviceIP, nodeIP, apiPort)
	if out, err := s.run(rules, "nft", "-f", "-"); err != nil {
		return fmt.Errorf("%v: %s", err, out)
	}
	return nil
}

func (s *supervisor) start(name, logPath, path string, args ...string) error {
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer f.Close()
	cmd := exec.Command(path, args...)
	cmd.Stdout, cmd.Stderr = f, f
	p, err := s.spawn(name, cmd)
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.order = append(s.order, p)
	s.mu.Unlock()
	logf("started %s (pid %d)", name, cmd.Process.Pid)
	return nil
}

// spawn starts cmd and registers it with the reaper (never cmd.Wait: the reaper, as PID 1,
// collects every child).
func (s *supervisor) spawn(name string, cmd *exec.Cmd) (*proc, error) {
	cmd.Env = append(os.Environ(), "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
	p := &proc{name: name, cmd: cmd, done: make(chan struct{})}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	s.procs[cmd.Process.Pid] = p
	return p, nil
}

// run runs a short command to completion and returns its combined output.
func (s *supervisor) run(stdin string, path string, args ...string) ([]byte, error) {
	var out strings.Builder
	cmd := exec.Command(path, args...)
	// Through a pipe the reaper cannot race with: output goes to a temp file.
	f, err := os.CreateTemp("", "kube-node-run-")
	if err != nil {
		return nil, err
	}
	defer os.Remove(f.Name())
	defer f.Close()
	cmd.Stdout, cmd.Stderr = f, f
	if stdin != "" {
		cmd.Stdin = strings.NewReader(stdin)
	}
	p, err := s.spawn(filepath.Base(path), cmd)
	if err != nil {
		return nil, err
	}
	select {
	case <-p.done:
	case <-time.After(60 * time.Second):
		_ = cmd.Process.Kill()
		<-p.done
	}
	b, _ := os.ReadFile(f.Name())
	out.Write(b)
	if p.code != 0 {
		return []byte(out.String()), fmt.Errorf("%s %s: exit status %d", path, strings.Join(args, " "), p.code)
	}
	return []byte(out.String()), nil
}

// reap collects every child and orphan (this is PID 1 of the namespace).
func (s *supervisor) reap() {
	sigchld := make(chan os.Signal, 16)
	signal.Notify(sigchld, syscall.SIGCHLD)
	for {
		for {
			var ws syscall.WaitStatus
			// Under the lock: start() registers a pid before this can reap it.
			s.mu.Lock()
			pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				s.mu.Unlock()
				break
			}
			p := s.procs[pid]
			delete(s.procs, pid)
			s.mu.Unlock()
			if p != nil {
				p.code = ws.ExitStatus()
				if ws.Signaled() {
					p.code = 128 + int(ws.Signal())
				}
				close(p.done)
			}
		}
		select {
		case <-sigchld:
		case <-time.After(time.Second):
		}
	}
}

func (s *supervisor) anyExit() <-chan *proc {
	ch := make(chan *proc, 1)
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, p := range s.order {
		go func() {
			<-p.done
			select {
			case ch <- p:
			default:
			}
		}()
	}
	return ch
}

// shutdown stops the kubelet first (so it does not restart containers), then everything.
// Whatever is left dies with this process (PID 1 of the namespace).
func (s *supervisor) shutdown(why error, etcd *embed.Etcd) error {
	logf("shutting down: %v", why)
	s.mu.Lock()
	order := append([]*proc(nil), s.order...)
	s.mu.Unlock()
	for i := len(order) - 1; i >= 0; i-- {
		p := order[i]
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(5 * time.Second):
			_ = p.cmd.Process.Kill()
		}
	}
	if etcd != nil {
		done := make(chan struct{})
		go func() { etcd.Close(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
		}
	}
	// Everything else in the namespace (pods, shims) is killed by the kernel when PID 1 exits.
	if strings.HasPrefix(why.Error(), "got ") {
		return nil
	}
	return why
}

// ---- readiness ---------------------------------------------------------------------------

// nodeReady tells whether node name has the condition Ready.
func nodeReady(api *launchkit.APIClient, name string) bool {
	code, body := api.Get("/api/v1/nodes/" + name)
	if code != http.StatusOK {
		return false
	}
	var node struct {
		Status struct {
			Conditions []struct {
				Type   string `json:"type"`
				Status string `json:"status"`
			} `json:"conditions"`
		} `json:"status"`
	}
	if json.Unmarshal(body, &node) != nil {
		return false
	}
	for _, c := range node.Status.Conditions {
		if c.Type == "Ready" {
			return c.Status == "True"
		}
	}
	return false
}

// ---- helpers -----------------------------------------------------------------------------

func tail(path string, n int) {
	f, err := os.Open(path)
	if err != nil {
		return
	}
	defer f.Close()
	var lines []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		lines = append(lines, sc.Text())
		if len(lines) > n {
			lines = lines[1:]
		}
	}
	for _, l := range lines {
		fmt.Fprintln(os.Stderr, l)
	}
}

// writeKubeconfig writes a kubeconfig with a bearer token or a client certificate.
func writeKubeconfig(path, server string, caPEM []byte, user, token, cert, key string) error {
	return launchkit.Kubeconfig{Cluster: "kube-node", Server: server, CAPEM: caPEM, User: user,
		Token: token, Cert: cert, Key: key}.Write(path)
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "kube-node: "+time.Now().Format("15:04:05.000")+" "+format+"\n", args...)
}
