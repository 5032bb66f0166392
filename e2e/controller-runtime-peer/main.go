// Command controller-runtime-peer is the controller-runtime side of
// benches/kube_controller.rs: one manager with leader election on a Lease, and
// one controller For(&corev1.ConfigMap{}) whose cache is restricted to one
// namespace and one label selector, as tenure's candidate in the bench is.
// With --owns-secrets the controller also Owns(&corev1.Secret{}, OnlyMetadata):
// a Secret whose controller owner reference names a ConfigMap reconciles that
// ConfigMap when it changes or is deleted (metadata only, as kube-runtime's
// owns watches children); the selector then restricts the Secrets too.
//
//	controller-runtime-peer --kubeconfig FILE --namespace NS --lease NAME --identity ID \
//	    --selector bench=controller [--owns-secrets] [--warmup] [--expect N] \
//	    [--lease-duration 15s] [--renew-deadline 10s] [--retry-period 2s]
//
// It prints one line per event on stdout, each ending with the wall-clock time
// in Unix nanoseconds, so that the bench merges them with tenure's:
//
//	READY <identity> <ns>  the manager is running (its non-leader runnables started)
//	WARM <identity> <ns>   --warmup only: the ConfigMap informer has synced
//	GRANT <identity> <ns>  this manager won the Lease: its acquiring write returned
//	ELECTED <identity> <ns> the manager's Elected() channel closed
//	FIRST <identity> <ns>  the first reconcile of the term started
//	ALL <identity> <ns>    --expect distinct objects have been reconciled in the term
//	REC <identity> <name> <ns>  after ALL: each reconcile's start, with the object's name
//
// --warmup sets the controller's EnableWarmup (controller-runtime v0.22+): its
// sources start, and its caches sync, before the manager is elected. Without it
// the informers start, and list, only once the manager leads.
//
// GRANT is taken from the lock, not from Elected(): controller-runtime closes
// Elected() only after it has started the leader-election runnables, so with a
// warm queue the first reconcile can start before it. The lock is client-go's
// LeaseLock built as controller-runtime builds it (leader-election User-Agent
// suffix, request timeout max(renew deadline / 2, 1s)), wrapped to print GRANT
// when the first write that makes this identity the holder succeeds; it
// records no Kubernetes Events.
//
// The requests carry the identity as User-Agent, so the API server's audit log
// attributes them. LeaderElectionReleaseOnCancel is on: on SIGTERM the leader
// stops its controller and releases the Lease before exiting 0. A manager
// holds one term: it exits when it loses leadership, as controller-runtime's do.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/config"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

var outMu sync.Mutex

func emit(event, identity string) {
	now := time.Now()
	outMu.Lock()
	defer outMu.Unlock()
	fmt.Fprintf(os.Stdout, "%s %s %d\n", event, identity, now.UnixNano())
}

// grantLock prints GRANT when the first write naming this identity as the
// holder succeeds: the acquisition (a follower writes nothing else).
type grantLock struct {
	resourcelock.Interface
	once sync.Once
}

func (g *grantLock) granted(rec resourcelock.LeaderElectionRecord, err error) error {
	if err == nil && rec.HolderIdentity == g.Identity() {
		g.once.Do(func() { emit("GRANT", g.Identity()) })
	}
	return err
}

func (g *grantLock) Create(ctx context.Context, rec resourcelock.LeaderElectionRecord) error {
	return g.granted(rec, g.Interface.Create(ctx, rec))
}

func (g *grantLock) Update(ctx context.Context, rec resourcelock.LeaderElectionRecord) error {
	return g.granted(rec, g.Interface.Update(ctx, rec))
}

// always is a runnable that runs on every replica, leader or not.
type always func(context.Context) error

func (a always) Start(ctx context.Context) error { return a(ctx) }
func (always) NeedLeaderElection() bool          { return false }

// reconciler logs the term's first reconcile, when --expect objects were seen,
// and after that each reconcile (the bench times a deleted child's owner).
type reconciler struct {
	identity string
	expect   int64
	first    sync.Once
	mu       sync.Mutex
	seen     map[string]struct{}
	all      atomic.Bool
}

func (r *reconciler) Reconcile(_ context.Context, req reconcile.Request) (reconcile.Result, error) {
	r.first.Do(func() { emit("FIRST", r.identity) })
	if r.all.Load() {
		emit("REC", r.identity+" "+req.Name)
		return reconcile.Result{}, nil
	}
	if r.expect > 0 && !r.all.Load() {
		r.mu.Lock()
		r.seen[req.Name] = struct{}{}
		done := int64(len(r.seen)) >= r.expect
		r.mu.Unlock()
		if done && r.all.CompareAndSwap(false, true) {
			emit("ALL", r.identity)
		}
	}
	// As tenure's candidate: nothing to do until the object changes.
	return reconcile.Result{}, nil
}

func main() {
	klog.InitFlags(flag.CommandLine)
	// --kubeconfig is controller-runtime's own flag (pkg/client/config registers it).
	namespace := flag.String("namespace", "default", "namespace of the Lease and of the watched ConfigMaps")
	lease := flag.String("lease", "", "name of the Lease (required)")
	identity := flag.String("identity", "", "identity in the event lines and User-Agent of the requests (required)")
	selector := flag.String("selector", "", "label selector of the watched ConfigMaps (and owned Secrets)")
	ownsSecrets := flag.Bool("owns-secrets", false, "Owns(&corev1.Secret{}, OnlyMetadata): a Secret's change or deletion reconciles its owner")
	warmup := flag.Bool("warmup", false, "EnableWarmup: start the controller's source (and sync its cache) before leading")
	expect := flag.Int64("expect", 0, "print ALL once this many distinct objects were reconciled (0: never)")
	leaseDuration := flag.Duration("lease-duration", 15*time.Second, "LeaseDuration")
	renewDeadline := flag.Duration("renew-deadline", 10*time.Second, "RenewDeadline")
	retryPeriod := flag.Duration("retry-period", 2*time.Second, "RetryPeriod")
	flag.Parse()

	if *lease == "" || *identity == "" {
		fmt.Fprintln(os.Stderr, "controller-runtime-peer: --lease and --identity are required")
		os.Exit(2)
	}
	// Quiet: the bench reads stdout; controller-runtime's logs would only cost time.
	ctrl.SetLogger(logr.Discard())
	klog.SetLogger(logr.Discard())

	sel, err := labels.Parse(*selector)
	if err != nil {
		fmt.Fprintf(os.Stderr, "controller-runtime-peer: --selector: %v\n", err)
		os.Exit(2)
	}
	cfg, err := config.GetConfig()
	if err != nil {
		fmt.Fprintf(os.Stderr, "controller-runtime-peer: kubeconfig: %v\n", err)
		os.Exit(1)
	}
	cfg.UserAgent = *identity

	lock, err := resourcelock.NewFromKubeconfig(resourcelock.LeasesResourceLock, *namespace, *lease,
		resourcelock.ResourceLockConfig{Identity: *identity}, cfg, *renewDeadline)
	if err != nil {
		fmt.Fprintf(os.Stderr, "controller-runtime-peer: lock: %v\n", err)
		os.Exit(1)
	}

	mgr, err := ctrl.NewManager(cfg, manager.Options{
		Cache: cache.Options{
			DefaultNamespaces: map[string]cache.Config{*namespace: {}},
			// Every cached kind (ConfigMaps, and the owned Secrets' metadata).
			DefaultLabelSelector: sel,
		},
		Metrics:                             metricsserver.Options{BindAddress: "0"},
		LeaderElection:                      true,
		LeaderElectionResourceLockInterface: &grantLock{Interface: lock},
		LeaderElectionID:                    *lease,
		LeaderElectionNamespace:             *namespace,
		LeaderElectionReleaseOnCancel:       true,
		LeaseDuration:                       leaseDuration,
		RenewDeadline:                       renewDeadline,
		RetryPeriod:                         retryPeriod,
	})
	if err != nil {
		fmt.Fprintf(os.Stderr, "controller-runtime-peer: manager: %v\n", err)
		os.Exit(1)
	}

	r := &reconciler{identity: *identity, expect: *expect, seen: map[string]struct{}{}}
	b := ctrl.NewControllerManagedBy(mgr).
		For(&corev1.ConfigMap{}).
		WithOptions(controller.Options{EnableWarmup: ptr.To(*warmup)})
	// The owned kind's cache entry: metadata only, as OnlyMetadata makes it.
	secrets := &metav1.PartialObjectMetadata{}
	secrets.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("Secret"))
	if *ownsSecrets {
		b = b.Owns(&corev1.Secret{}, builder.OnlyMetadata)
	}
	err = b.Complete(r)
	if err != nil {
		fmt.Fprintf(os.Stderr, "controller-runtime-peer: controller: %v\n", err)
		os.Exit(1)
	}

	// On every replica: READY once the manager runs; with --warmup, WARM once the
	// informers the controller's sources use (the manager's shared ones) have
	// synced. Without --warmup nothing here touches an informer, which would
	// start it early.
	err = mgr.Add(always(func(ctx context.Context) error {
		emit("READY", *identity)
		if *warmup {
			kinds := []client.Object{&corev1.ConfigMap{}}
			if *ownsSecrets {
				kinds = append(kinds, secrets)
			}
			for _, kind := range kinds {
				if _, err := mgr.GetCache().GetInformer(ctx, kind, cache.BlockUntilSynced(true)); err != nil {
					if ctx.Err() != nil {
						return nil
					}
					return err
				}
			}
			emit("WARM", *identity)
		}
		<-ctx.Done()
		return nil
	}))
	if err != nil {
		fmt.Fprintf(os.Stderr, "controller-runtime-peer: add: %v\n", err)
		os.Exit(1)
	}

	ctx := ctrl.SetupSignalHandler()
	go func() {
		select {
		case <-mgr.Elected():
			emit("ELECTED", *identity)
		case <-ctx.Done():
		}
	}()
	if err := mgr.Start(ctx); err != nil {
		fmt.Fprintf(os.Stderr, "controller-runtime-peer: %v\n", err)
		os.Exit(1)
	}
}
