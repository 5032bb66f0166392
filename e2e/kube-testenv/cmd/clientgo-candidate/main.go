// Command clientgo-candidate is a leader-election candidate built on
// client-go's tools/leaderelection with a coordination.k8s.io/v1 LeaseLock,
// for interoperability tests against other implementations.
//
//	clientgo-candidate --kubeconfig FILE --lease NAME --identity ID \
//	    [--namespace default] [--lease-duration 15s] [--renew-deadline 10s] [--retry-period 2s] [--rejoin]
//	    [--timestamps] [--user-agent clientgo-candidate]
//
// It prints one line per event on stdout (logs go to stderr):
//
//	STARTED <identity>    this candidate became leader (OnStartedLeading)
//	ENDED <identity>      its leading context was cancelled: the workload must stop
//	                      (before a release, or after the lease was lost)
//	STOPPED <identity>    the election loop ended (OnStoppedLeading; client-go
//	                      calls it also when the candidate never led)
//	NEWLEADER <identity>  a new holder was observed (OnNewLeader), possibly
//	                      itself; "NEWLEADER" alone when the lease was released
//
// With --timestamps every line ends with the wall-clock time in Unix
// nanoseconds ("STARTED go-1 1764467000123456789"), so that a test can merge
// the events into one timeline with its own.
//
// ReleaseOnCancel is true: on SIGTERM/SIGINT a leader releases the Lease
// (holder cleared, leaseDurationSeconds 1) before exiting 0. A leader that
// loses the lease otherwise exits 1 ("lost"), as client-go controllers do,
// unless --rejoin is given, in which case it runs for the lease again.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	coordinationv1client "k8s.io/client-go/kubernetes/typed/coordination/v1"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/klog/v2"
)

var (
	outMu      sync.Mutex
	timestamps bool
)

func emit(event, identity string) {
	now := time.Now()
	outMu.Lock()
	defer outMu.Unlock()
	line := event
	if identity != "" {
		line += " " + identity
	}
	if timestamps {
		line += fmt.Sprintf(" %d", now.UnixNano())
	}
	fmt.Fprintln(os.Stdout, line)
}

func main() {
	klog.InitFlags(flag.CommandLine)
	kubeconfig := flag.String("kubeconfig", os.Getenv("KUBECONFIG"), "kubeconfig file (default $KUBECONFIG)")
	namespace := flag.String("namespace", "default", "namespace of the Lease")
	lease := flag.String("lease", "", "name of the Lease (required)")
	identity := flag.String("identity", "", "holder identity (default hostname_pid)")
	leaseDuration := flag.Duration("lease-duration", 15*time.Second, "LeaseDuration")
	renewDeadline := flag.Duration("renew-deadline", 10*time.Second, "RenewDeadline")
	retryPeriod := flag.Duration("retry-period", 2*time.Second, "RetryPeriod")
	rejoin := flag.Bool("rejoin", false, "after losing the lease, run for it again instead of exiting 1")
	flag.BoolVar(&timestamps, "timestamps", false, "end every event line with the wall-clock time in Unix nanoseconds")
	userAgent := flag.String("user-agent", "clientgo-candidate", "User-Agent of its API requests (to tell candidates apart in an audit log)")
	flag.Parse()

	if *lease == "" || *kubeconfig == "" {
		fmt.Fprintln(os.Stderr, "clientgo-candidate: --lease and --kubeconfig (or $KUBECONFIG) are required")
		os.Exit(2)
	}
	if *identity == "" {
		host, _ := os.Hostname()
		*identity = fmt.Sprintf("%s_%d", host, os.Getpid())
	}

	cfg, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		klog.Fatalf("kubeconfig: %v", err)
	}
	cfg.UserAgent = *userAgent
	client, err := coordinationv1client.NewForConfig(cfg)
	if err != nil {
		klog.Fatalf("client: %v", err)
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()

	for {
		lock := &resourcelock.LeaseLock{
			LeaseMeta:  metav1.ObjectMeta{Namespace: *namespace, Name: *lease},
			Client:     client,
			LockConfig: resourcelock.ResourceLockConfig{Identity: *identity},
		}
		le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
			Lock:            lock,
			LeaseDuration:   *leaseDuration,
			RenewDeadline:   *renewDeadline,
			RetryPeriod:     *retryPeriod,
			ReleaseOnCancel: true,
			Name:            *lease,
			Callbacks: leaderelection.LeaderCallbacks{
				OnStartedLeading: func(ctx context.Context) {
					emit("STARTED", *identity)
					<-ctx.Done()
					emit("ENDED", *identity)
				},
				OnStoppedLeading: func() { emit("STOPPED", *identity) },
				OnNewLeader:      func(id string) { emit("NEWLEADER", id) },
			},
		})
		if err != nil {
			klog.Fatalf("leader elector: %v", err)
		}
		le.Run(ctx) // returns when ctx is done (after releasing) or the lease is lost
		if ctx.Err() != nil {
			klog.Infof("signalled, exiting")
			os.Exit(0)
		}
		if !*rejoin {
			klog.Errorf("lost lease %s/%s, exiting", *namespace, *lease)
			os.Exit(1)
		}
		klog.Infof("lost lease %s/%s, running for it again", *namespace, *lease)
	}
}
