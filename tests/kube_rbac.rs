//! The restricted `tester` user: a Role granting get/list/watch/create/update on leases in one
//! namespace is enough; without `update` the backend fails with a permission error that names
//! the verb. A sharded group's member heartbeat needs `patch` too, and says so without it.

mod kube_support;

use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::api::{Api, PostParams};
use kube_support::{shared, unique};
use tenure::backend::kube::{KubeBackend, KubeOptions};
use tenure::backend::{
    AcquireRequest, Acquired, Backend, BackendError, BackendErrorKind, HolderToken, Member,
};
use tenure::{LockError, LockOptions, Locker};

/// Creates `namespace` with a Role granting `verbs` on leases to the `tester` user.
async fn grant(namespace: &str, verbs: &[&str]) {
    let server = shared();
    server.namespace(namespace).await;
    let client = server.admin().await;
    let role: Role = serde_json::from_value(serde_json::json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {"name": "tenure-leases", "namespace": namespace},
        "rules": [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": verbs}]
    }))
    .expect("role json");
    let binding: RoleBinding = serde_json::from_value(serde_json::json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": "tenure-leases", "namespace": namespace},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "tenure-leases"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "tester"}]
    }))
    .expect("binding json");
    Api::<Role>::namespaced(client.clone(), namespace)
        .create(&PostParams::default(), &role)
        .await
        .expect("create role");
    Api::<RoleBinding>::namespaced(client, namespace)
        .create(&PostParams::default(), &binding)
        .await
        .expect("create rolebinding");
}

async fn tester(namespace: &str) -> KubeBackend {
    KubeBackend::from_kubeconfig(
        shared().tester_kubeconfig(),
        KubeOptions::new().namespace(namespace),
    )
    .await
    .expect("tester backend")
}

fn request(name: &str) -> AcquireRequest {
    AcquireRequest {
        name: name.into(),
        holder: HolderToken::random(),
        identity: "tester".into(),
        ttl: Duration::from_secs(5),
    }
}

/// The ttl of the leases taken through the lock runtime: a renewal a second, and each request
/// may take 2 s, what an API server on a loaded machine needs now and then (#42); none of the
/// tests here is about timing.
const TTL: Duration = Duration::from_secs(3);

fn opts() -> LockOptions {
    LockOptions::new()
        .ttl(TTL)
        .request_timeout(Duration::from_secs(2))
}

/// Retries `f` while it is denied, for RBAC's caches to catch up with a new Role.
async fn once_allowed<T, F, Fut>(mut f: F) -> Result<T, BackendError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, BackendError>>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        match f().await {
            Err(e)
                if e.kind() == BackendErrorKind::PermissionDenied
                    && tokio::time::Instant::now() < deadline =>
            {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            other => return other,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_documented_role_is_enough() {
    let ns = unique("rbac-ok");
    grant(&ns, &["get", "list", "watch", "create", "update"]).await;
    let backend = tester(&ns).await;
    let name = unique("lock");
    once_allowed(|| backend.inspect(&name))
        .await
        .expect("get is granted");

    let holder = Locker::with_identity(backend.clone(), "tester-1").expect("identity");
    let opts = opts().auto_renew(true);
    let lease = holder.try_acquire(&name, &opts).await.expect("create");
    let renewed = tokio::time::timeout(TTL * 5, async {
        while holder.stats().renewals() < 2 && lease.is_valid() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    assert!(
        renewed.is_ok() && lease.is_valid(),
        "renewals (update) must work: {:?}, {:?}",
        lease.end(),
        holder.stats()
    );

    // A waiter in another "process" uses list + watch and is woken by the release.
    let waiter = Locker::with_identity(tester(&ns).await, "tester-2").expect("identity");
    let (n, o) = (
        name.clone(),
        opts.clone()
            .retry_interval(Duration::from_secs(30))
            .wait(Duration::from_secs(30)),
    );
    let waiting = tokio::spawn(async move { waiter.acquire(&n, &o).await });
    tokio::time::sleep(Duration::from_millis(500)).await;
    let released = tokio::time::Instant::now();
    lease.release().await.expect("release (update)");
    let next = waiting
        .await
        .expect("waiter task")
        .expect("woken by the release");
    // Within two ttls of the release: its write, the watch event and the take-over's writes,
    // on an API server that may be slow on a loaded machine.
    assert!(
        released.elapsed() < TTL * 2,
        "taken over {:?} after the release",
        released.elapsed()
    );
    assert!(next.fencing_token() > lease.fencing_token());
    next.release().await.expect("release");

    let mut changes = backend.observe(&name);
    let first = tokio::time::timeout(Duration::from_secs(5), changes.next())
        .await
        .expect("watch (list + watch) is granted");
    assert!(matches!(first, Some(Ok(_))), "{first:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_update_the_error_names_the_verb() {
    let ns = unique("rbac-no-update");
    grant(&ns, &["get", "list", "watch", "create"]).await;
    let backend = tester(&ns).await;
    let fresh = unique("fresh");
    let req = request(&fresh);
    // Creating a missing Lease needs only `create`...
    let granted = once_allowed(|| backend.try_acquire(&req)).await;
    assert!(
        matches!(granted, Ok(Acquired::Granted { .. })),
        "{granted:?}"
    );
    // ...but every later write is an update.
    let e = backend
        .renew(&fresh, &req.holder, req.ttl)
        .await
        .expect_err("renew needs update");
    assert_eq!(e.kind(), BackendErrorKind::PermissionDenied, "{e}");
    eprintln!("renew without update: {e}");
    assert!(e.message().contains("\"update\""), "{e}");
    assert!(e.message().contains("leases"), "{e}");
    assert!(e.message().contains(&ns), "{e}");

    // Through the lock runtime: a typed, permanent error, not "busy".
    let locker = Locker::with_identity(backend, "tester").expect("identity");
    let e = locker.try_acquire(&fresh, &opts()).await;
    match e {
        // The lease above is held by our first request for 5 s: that is "busy" (no write).
        Err(LockError::NotAcquired { .. }) => {}
        other => panic!("{other:?}"),
    }
    tokio::time::sleep(Duration::from_millis(5500)).await;
    match locker.try_acquire(&fresh, &opts()).await {
        Err(LockError::Backend(e)) => {
            assert_eq!(e.kind(), BackendErrorKind::PermissionDenied, "{e}");
            assert!(e.message().contains("\"update\""), "{e}");
        }
        other => panic!("taking over an expired lease needs update: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_no_role_reads_are_denied_by_name() {
    let ns = unique("rbac-none");
    shared().namespace(&ns).await;
    let backend = tester(&ns).await;
    let e = backend
        .try_acquire(&request("x"))
        .await
        .expect_err("no role");
    assert_eq!(e.kind(), BackendErrorKind::PermissionDenied, "{e}");
    assert!(e.message().contains("\"get\""), "{e}");
    assert!(!e.is_transient());
}

/// What the API server says the user may not do, polled until RBAC's caches have `want`.
async fn missing_until(backend: &KubeBackend, lease: &str, want: &[&str]) -> Vec<&'static str> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let missing = backend
            .missing_permissions(lease)
            .await
            .expect("the reviews are answered");
        if missing == want || tokio::time::Instant::now() >= deadline {
            return missing;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `missing_permissions` asks the API server (SelfSubjectAccessReview) and names exactly the
/// verbs the user lacks on the Lease; `tenure run` refuses to campaign without them (exit 4,
/// one line naming the verb), instead of following quietly until it has to take over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_permissions_are_named_before_any_campaign() {
    let all = ["get", "list", "watch", "create", "update"];
    let ok = unique("rbac-check-ok");
    grant(&ok, &all).await;
    assert_eq!(
        missing_until(&tester(&ok).await, "x", &[]).await,
        Vec::<&str>::new()
    );

    let no_update = unique("rbac-check-no-update");
    grant(&no_update, &["get", "list", "watch", "create"]).await;
    assert_eq!(
        missing_until(&tester(&no_update).await, "x", &["update"]).await,
        ["update"]
    );

    // A Role for another Lease only: nothing on this one but create.
    let other = unique("rbac-check-other");
    shared().namespace(&other).await;
    let client = shared().admin().await;
    let role: Role = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "tenure-leases", "namespace": other},
        "rules": [
            {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
             "resourceNames": ["someone-else"], "verbs": ["get", "list", "watch", "update"]},
            {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
        ]
    }))
    .expect("role json");
    let binding: RoleBinding = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "tenure-leases", "namespace": other},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "tenure-leases"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "tester"}]
    }))
    .expect("binding json");
    Api::<Role>::namespaced(client.clone(), &other)
        .create(&PostParams::default(), &role)
        .await
        .expect("create role");
    Api::<RoleBinding>::namespaced(client, &other)
        .create(&PostParams::default(), &binding)
        .await
        .expect("create rolebinding");
    let backend = tester(&other).await;
    assert_eq!(
        missing_until(&backend, "someone-else", &[]).await,
        Vec::<&str>::new()
    );
    assert_eq!(
        backend.missing_permissions("x").await.expect("answered"),
        ["get", "list", "watch", "update"]
    );

    #[cfg(feature = "cli")]
    {
        let kubeconfig = shared().tester_kubeconfig();
        let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_tenure"))
            .args(["run", "--lease", "x", "--backend", "kube", "--namespace"])
            .arg(&no_update)
            .args(["--", "sh", "-c", "echo ran"])
            .env("KUBECONFIG", kubeconfig)
            .output()
            .await
            .expect("tenure runs");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(4), "{stderr}");
        // With every permission, the same command line leads and runs the command.
        let granted = tokio::process::Command::new(env!("CARGO_BIN_EXE_tenure"))
            .args(["run", "--lease", "x", "--backend", "kube", "--namespace"])
            .arg(&ok)
            .args(["--", "sh", "-c", "echo ran"])
            .env("KUBECONFIG", shared().tester_kubeconfig())
            .output()
            .await
            .expect("tenure runs");
        assert_eq!(
            (
                granted.status.code(),
                String::from_utf8_lossy(&granted.stdout).trim()
            ),
            (Some(0), "ran"),
            "{}",
            String::from_utf8_lossy(&granted.stderr)
        );
        assert!(out.stdout.is_empty(), "the command ran");
        let line = stderr
            .lines()
            .find(|l| l.starts_with("tenure: "))
            .unwrap_or_else(|| panic!("no error line: {stderr}"));
        assert!(
            line.contains(&format!(
                "kube namespace {no_update}: this user may not update lease \"x\""
            )),
            "{line}"
        );
    }
}

/// A sharded group's member heartbeat is one server-side apply (#42): with the Role the chart
/// and `tenure policy` give a sharded group (which has `patch`) it creates the member Lease
/// and renews it; with the Role they gave before (no `patch`) it fails with a permission error
/// naming the verb, not with a generic failure.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sharded_members_heartbeat_needs_patch_and_says_so() {
    let me = Member {
        identity: "tester-member".into(),
        shards: 4,
        joined_ms: 1,
        holds: vec![1, 2],
    };
    let ttl = Duration::from_secs(10);
    let group = "rbac-group";

    let old = unique("rbac-shard-old");
    grant(
        &old,
        &["get", "list", "watch", "update", "create", "delete"],
    )
    .await;
    let backend = tester(&old).await;
    once_allowed(|| backend.inspect("anything"))
        .await
        .expect("get is granted");
    let denied = backend
        .announce_member(group, &me, ttl)
        .await
        .expect_err("a heartbeat without patch");
    assert_eq!(
        denied.kind(),
        BackendErrorKind::PermissionDenied,
        "{denied}"
    );
    assert!(denied.to_string().contains("\"patch\""), "{denied}");

    let ns = unique("rbac-shard");
    grant(
        &ns,
        &[
            "get", "list", "watch", "update", "patch", "create", "delete",
        ],
    )
    .await;
    let backend = tester(&ns).await;
    once_allowed(|| backend.announce_member(group, &me, ttl))
        .await
        .expect("the first heartbeat creates the member Lease");
    backend
        .announce_member(group, &me, ttl)
        .await
        .expect("the next renews it");
    let mut members = backend.members(group);
    let seen = tokio::time::timeout(Duration::from_secs(10), members.next())
        .await
        .expect("the membership read answered")
        .expect("a membership item")
        .expect("the membership");
    assert_eq!(seen, vec![me.clone()]);
    backend
        .withdraw_member(group, &me.identity)
        .await
        .expect("delete is granted");
}
