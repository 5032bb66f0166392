//! The real `tenure` binary on a real kube-apiserver: two replicas on one Lease, hand-over on
//! exit and on `kill -9`, the Lease as client-go writes it, and `tenure status`.

mod cli_support;
mod kube_support;

use std::time::Duration;

use cli_support::{
    Tenure, alive, assert_one_at_a_time, events, identity_of, now_ns, read_pid, run_to_end,
    shard_of, shard_worker, wait_until, worker,
};

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn two_replicas_on_a_lease_hand_over_on_exit_and_on_kill_9() {
    let server = kube_support::shared();
    let ns = kube_support::unique("cli");
    runtime().block_on(server.namespace(&ns));
    let kubeconfig = server.admin_kubeconfig().display().to_string();
    let env = [("KUBECONFIG", kubeconfig.as_str())];
    let dir = kube_support::fresh_dir("cli");
    let p = |n: &str| dir.join(n);
    let log = p("log");
    let run_args = |id: &str, command: Vec<String>| {
        cli_support::run_args(
            "worker",
            &["--backend", "kube", "--namespace", &ns],
            &["--identity", id],
            command,
        )
    };
    let mut a = Tenure::start(
        &run_args("a", worker(&log, &p("pa"), -1.0, 0)),
        &env,
        p("ea"),
    );
    let pid_a = read_pid(&p("pa"), Duration::from_secs(20));
    let mut b = Tenure::start(
        &run_args("b", worker(&log, &p("pb"), 1.0, 0)),
        &env,
        p("eb"),
    );
    let mut c = Tenure::start(
        &run_args("c", worker(&log, &p("pc"), 1.0, 0)),
        &env,
        p("ec"),
    );
    std::thread::sleep(Duration::from_millis(500));

    // The Lease names a as holder, as client-go would.
    let (code, out, err) = run_to_end(
        &[
            "status",
            "--lease",
            "worker",
            "--backend",
            "kube",
            "--namespace",
            &ns,
            "-o",
            "json",
        ],
        &env,
    );
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("\"holder\":\"a\""), "{out}");
    let lease = runtime()
        .block_on(server.lease(&ns, "worker"))
        .unwrap_or_else(|| panic!("no Lease"));
    assert_eq!(
        lease
            .spec
            .as_ref()
            .and_then(|s| s.holder_identity.as_deref()),
        Some("a")
    );

    a.signal(libc::SIGKILL);
    a.wait(Duration::from_secs(5));
    wait_until(Duration::from_secs(5), "a's command to die with a", || {
        !alive(pid_a)
    });
    let death = now_ns();
    assert!(b.wait(Duration::from_secs(40)).success(), "{}", b.log());
    assert!(c.wait(Duration::from_secs(40)).success(), "{}", c.log());
    let ev = events(&log);
    assert_eq!(ev.iter().filter(|e| e.kind == "start").count(), 3, "{ev:?}");
    assert_one_at_a_time(&ev, &[(pid_a, death)]);
}

/// Reads the Election's status as admin.
async fn election_status(
    client: &kube::Client,
    ns: &str,
    name: &str,
) -> Option<tenure::crd::ElectionStatus> {
    let api: kube::Api<tenure::crd::Election> = kube::Api::namespaced(client.clone(), ns);
    api.get_opt(name)
        .await
        .unwrap_or_else(|e| panic!("get election: {e}"))
        .and_then(|e| e.status)
}

#[test]
fn publish_status_shows_who_leads_in_the_election() {
    let server = kube_support::shared();
    let rt = runtime();
    let client = rt.block_on(server.admin());
    rt.block_on(kube_support::install_crd(&client));
    let ns = kube_support::unique("cli-el");
    rt.block_on(server.namespace(&ns));
    let kubeconfig = server.admin_kubeconfig().display().to_string();
    let env = [("KUBECONFIG", kubeconfig.as_str())];
    let dir = kube_support::fresh_dir("cli-el");
    let p = |n: &str| dir.join(n);
    let log = p("log");
    // The lease lives on the local backend; the Election in Kubernetes says who leads.
    let state = p("state").display().to_string();
    let run_args = |id: &str, command: Vec<String>| {
        let backend = [
            "--backend",
            "local",
            "--state-dir",
            &state,
            "--namespace",
            &ns,
        ];
        cli_support::run_args(
            "report",
            &backend,
            &["--publish-status", "--identity", id],
            command,
        )
    };
    let mut a = Tenure::start(
        &run_args("a", worker(&log, &p("pa"), 6.0, 0)),
        &env,
        p("ea"),
    );
    read_pid(&p("pa"), Duration::from_secs(20));
    let mut b = Tenure::start(
        &run_args("b", worker(&log, &p("pb"), -1.0, 0)),
        &env,
        p("eb"),
    );
    let token_a = events(&log)[0].token;
    // Polls the Election until it shows `leader` with `token`; returns that status.
    let wait_for_leader = |leader: &str, token: u64| {
        let mut seen = None;
        wait_until(
            Duration::from_secs(20),
            &format!("the Election to show {leader} leading"),
            || {
                seen = rt.block_on(election_status(&client, &ns, "report"));
                seen.as_ref().is_some_and(|s| {
                    s.leader.as_deref() == Some(leader) && s.fencing_token == Some(token)
                })
            },
        );
        seen.unwrap_or_default()
    };
    wait_for_leader("a", token_a);
    // a's command ends after 6 s; b takes over and publishes its higher token.
    assert!(a.wait(Duration::from_secs(20)).success(), "{}", a.log());
    read_pid(&p("pb"), Duration::from_secs(20));
    let token_b = events(&log)
        .iter()
        .find(|e| e.kind == "start" && e.rest.ends_with(" b"))
        .map_or(0, |e| e.token);
    assert!(token_b > token_a);
    let status = wait_for_leader("b", token_b);
    assert!(status.transitions.unwrap_or(0) >= 1, "{status:?}");
    assert!(
        status.candidates.iter().any(|c| c.identity == "b"),
        "{status:?}"
    );
    b.signal(libc::SIGTERM);
    b.wait(Duration::from_secs(20));
}

/// Issue #26: `kubectl get elections` shows a sharded group: its count, each shard's holder
/// and token (the token the shard's copy got), and each member's count; a member that
/// leaves takes its entries along.
#[test]
fn publish_status_shows_each_shard_of_a_group_with_its_holder_and_token() {
    let server = kube_support::shared();
    let rt = runtime();
    let client = rt.block_on(server.admin());
    rt.block_on(kube_support::install_crd(&client));
    let ns = kube_support::unique("cli-shel");
    rt.block_on(server.namespace(&ns));
    let kubeconfig = server.admin_kubeconfig().display().to_string();
    let env = [("KUBECONFIG", kubeconfig.as_str())];
    let dir = kube_support::fresh_dir("cli-shel");
    let log = dir.join("log");
    // The shard leases live on the local backend; the Election in Kubernetes shows them.
    let state = dir.join("state").display().to_string();
    let start = |id: &str| {
        let backend = [
            "--backend",
            "local",
            "--state-dir",
            &state,
            "--namespace",
            &ns,
        ];
        let args = cli_support::run_args(
            "crawl",
            &backend,
            &["--shards", "4", "--publish-status", "--identity", id],
            shard_worker(&log, 0.0),
        );
        Tenure::start(&args, &env, dir.join(format!("err-{id}")))
    };
    let mut a = start("a");
    let mut b = start("b");
    // The token each shard's running copy got, by shard: (holder, token).
    let running = || {
        let ev = events(&log);
        let mut out = std::collections::BTreeMap::new();
        for e in ev.iter().filter(|e| e.kind == "start") {
            if !ev.iter().any(|x| x.kind == "end" && x.pid == e.pid) {
                out.insert(shard_of(e), (identity_of(e).to_owned(), e.token));
            }
        }
        out
    };
    let published = |s: &tenure::crd::ElectionStatus| {
        s.shards
            .iter()
            .map(|e| (e.shard, (e.holder.clone(), e.fencing_token)))
            .collect::<std::collections::BTreeMap<_, _>>()
    };
    let mut seen = None;
    wait_until(
        Duration::from_secs(30),
        "the Election to show 4 shards split 2/2, as the copies run them",
        || {
            seen = rt.block_on(election_status(&client, &ns, "crawl"));
            let now = running();
            seen.as_ref().is_some_and(|s| {
                let by = |id: &str| now.values().filter(|(h, _)| h == id).count();
                now.len() == 4 && by("a") == 2 && by("b") == 2 && published(s) == now
            })
        },
    );
    let status = seen.take().unwrap_or_default();
    assert_eq!(
        (status.shard_count, status.held_shards),
        (Some(4), Some(4)),
        "{status:?}"
    );
    let members: Vec<(&str, Option<u32>)> = status
        .candidates
        .iter()
        .map(|c| (c.identity.as_str(), c.shards))
        .collect();
    assert_eq!(members, vec![("a", Some(4)), ("b", Some(4))]);
    let election: kube::Api<tenure::crd::Election> = kube::Api::namespaced(client.clone(), &ns);
    let spec = rt
        .block_on(election.get("crawl"))
        .expect("the Election")
        .spec;
    assert_eq!((spec.lease.as_str(), spec.shards), ("crawl", Some(4)));

    // b leaves: a takes its shards with new tokens, and the Election follows.
    b.signal(libc::SIGTERM);
    assert!(b.wait(Duration::from_secs(20)).success(), "{}", b.log());
    wait_until(
        Duration::from_secs(30),
        "the Election to show every shard held by a, with the copies' tokens",
        || {
            seen = rt.block_on(election_status(&client, &ns, "crawl"));
            let now = running();
            seen.as_ref().is_some_and(|s| {
                now.len() == 4
                    && now.values().all(|(h, _)| h == "a")
                    && published(s) == now
                    && s.candidates.iter().all(|c| c.identity != "b")
            })
        },
    );
    a.signal(libc::SIGTERM);
    assert!(a.wait(Duration::from_secs(20)).success(), "{}", a.log());
    let left = rt
        .block_on(election_status(&client, &ns, "crawl"))
        .unwrap_or_default();
    assert!(
        left.shards.is_empty() && left.candidates.is_empty(),
        "the last member left its entries: {left:?}"
    );
}

/// Creates every object of a `tenure policy` YAML stream as admin; the first refusal's
/// message, if any.
async fn create_all(yaml: &str) -> Result<usize, String> {
    use kube::api::{DynamicObject, PostParams};
    use kube::discovery::Discovery;
    let client = kube_support::shared().admin().await;
    let discovery = Discovery::new(client.clone())
        .run()
        .await
        .map_err(|e| e.to_string())?;
    let mut created = 0;
    for doc in yaml.split("\n---\n") {
        let object: DynamicObject = serde_saphyr::from_str(doc).map_err(|e| e.to_string())?;
        let types = object.types.clone().ok_or("no apiVersion/kind")?;
        let (group, version) = types
            .api_version
            .split_once('/')
            .unwrap_or(("", &types.api_version));
        let (resource, _) = discovery
            .resolve_gvk(&kube::api::GroupVersionKind::gvk(
                group,
                version,
                &types.kind,
            ))
            .ok_or("unknown kind")?;
        let api: kube::Api<DynamicObject> = match object.metadata.namespace.as_deref() {
            Some(ns) => kube::Api::namespaced_with(client.clone(), ns, &resource),
            None => kube::Api::all_with(client.clone(), &resource),
        };
        match api.create(&PostParams::default(), &object).await {
            Ok(_) => {}
            // The anchor is shared by every election: the first apply made it.
            Err(kube::Error::Api(s))
                if s.code == 409
                    && object.metadata.name.as_deref()
                        == Some(tenure::fence::kube::ANCHOR_NAME) => {}
            Err(e) => return Err(e.to_string()),
        }
        created += 1;
    }
    Ok(created)
}

#[test]
fn policy_prints_what_the_api_server_accepts_and_bad_input_names_the_flag() {
    let rt = runtime();
    let ns = kube_support::unique("policy");
    rt.block_on(kube_support::shared().namespace(&ns));
    let (code, yaml, err) = run_to_end(
        &[
            "policy",
            "--lease",
            "reports",
            "--namespace",
            &ns,
            "--service-account",
            "reports",
            "--resource",
            "configmaps",
            "--resource",
            "deployments.apps",
        ],
        &[],
    );
    assert_eq!(code, 0, "{err}");
    // The default policy (every resource) too: the API server must accept both.
    let (code, every, err) = run_to_end(&["policy", "--lease", "all", "--namespace", &ns], &[]);
    assert_eq!(code, 0, "{err}");
    assert!(
        every.contains("system:serviceaccount:") && every.contains(":tenure'"),
        "{every}"
    );
    assert_eq!(
        rt.block_on(create_all(&yaml)),
        Ok(9),
        "the anchor's policy and binding, the Lease, the policy, its binding; the worker's \
         Role, RoleBinding, the token extra's ClusterRole and ClusterRoleBinding"
    );
    assert_eq!(
        rt.block_on(create_all(
            &every.replace("tenure-fencing.", "tenure-fencing-all.")
        )),
        Ok(9)
    );
    // A policy the API server refuses (a CEL syntax error): its own message reaches the user.
    let broken = yaml
        .replace("name: reports\n", "name: reports-broken\n")
        .replace(".reports\n", ".reports-broken\n")
        .replace("variables.token.matches(", "variables.token.matches((");
    assert!(
        yaml.contains("variables.token.matches("),
        "the CEL this test breaks is gone: {yaml}"
    );
    let refused = rt
        .block_on(create_all(&broken))
        .expect_err("a broken policy must be refused");
    assert!(
        refused.contains("compilation failed") || refused.contains("Syntax error"),
        "{refused}"
    );

    for (args, flag) in [
        (vec!["--lease", "Bad", "--namespace", "ns"], "--lease"),
        (vec!["--lease", "ok", "--namespace", "NS"], "--namespace"),
        (
            vec![
                "--lease",
                "ok",
                "--namespace",
                "ns",
                "--service-account",
                "a b",
            ],
            "--service-account",
        ),
        (
            vec![
                "--lease",
                "ok",
                "--namespace",
                "ns",
                "--resource",
                "Deployments",
            ],
            "--resource",
        ),
        (
            vec!["--lease", "ok", "--namespace", "ns", "--user", "it's"],
            "--user",
        ),
    ] {
        let mut all = vec!["policy"];
        all.extend(args);
        let (code, out, err) = run_to_end(&all, &[]);
        assert_eq!(code, 2, "{all:?}: {err}");
        assert!(out.is_empty(), "nothing printed on bad input: {out}");
        let lines: Vec<&str> = err.lines().collect();
        assert_eq!(lines.len(), 1, "one line: {err}");
        assert!(lines[0].starts_with(&format!("tenure: {flag}: ")), "{err}");
    }
}

/// `tenure drain` (the chart's pre-delete hook) on the real apiserver. This server has no
/// garbage collector, so a Deployment deleted with foreground propagation stays, marked for
/// deletion, as it would while its pods stop: drain must wait for it and give up at
/// `--timeout` (exit 1); a Deployment already gone is success; bad flags name the flag.
#[test]
fn drain_waits_for_the_deployment_to_be_gone_and_bad_input_names_the_flag() {
    use k8s_openapi::api::apps::v1::Deployment;
    let rt = runtime();
    let server = kube_support::shared();
    let ns = kube_support::unique("drain");
    rt.block_on(server.namespace(&ns));
    let kubeconfig = server.admin_kubeconfig().display().to_string();
    let env = [("KUBECONFIG", kubeconfig.as_str())];
    let deployment: Deployment = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "worker"},
        "spec": {
            "selector": {"matchLabels": {"app": "worker"}},
            "template": {
                "metadata": {"labels": {"app": "worker"}},
                "spec": {"containers": [{"name": "w", "image": "busybox"}]}
            }
        }
    }))
    .unwrap_or_else(|e| panic!("{e}"));
    let api: kube::Api<Deployment> = kube::Api::namespaced(rt.block_on(server.admin()), &ns);
    rt.block_on(api.create(&Default::default(), &deployment))
        .unwrap_or_else(|e| panic!("create: {e}"));

    let started = std::time::Instant::now();
    let (code, out, err) = run_to_end(
        &[
            "drain",
            "--deployment",
            "worker",
            "--namespace",
            &ns,
            "--timeout",
            "2s",
        ],
        &env,
    );
    assert_eq!(code, 1, "still there at --timeout: {out}{err}");
    assert!(started.elapsed() >= Duration::from_secs(2), "it waited");
    assert_eq!(
        err.trim(),
        format!("tenure: deployment {ns}/worker still has pods after --timeout 2s")
    );
    // Deleted with foreground propagation: the API server keeps it until its dependents are
    // gone (here never: no garbage collector).
    let left = rt
        .block_on(api.get("worker"))
        .unwrap_or_else(|e| panic!("get: {e}"));
    assert!(left.metadata.deletion_timestamp.is_some(), "{left:?}");
    assert_eq!(
        left.metadata.finalizers,
        Some(vec!["foregroundDeletion".to_owned()])
    );

    let (code, out, err) = run_to_end(&["drain", "--deployment", "gone", "--namespace", &ns], &env);
    assert_eq!(code, 0, "{err}");
    assert_eq!(out.trim(), format!("deployment {ns}/gone is already gone"));

    // Recreated under the same name while it drains: the drain follows the UID, ends when
    // the one it deleted is gone, and leaves the new one alone.
    let mut again = deployment.clone();
    again.metadata.name = Some("again".into());
    rt.block_on(api.create(&Default::default(), &again))
        .unwrap_or_else(|e| panic!("create: {e}"));
    let drain = std::thread::spawn({
        let (ns, kubeconfig) = (ns.clone(), kubeconfig.clone());
        move || {
            let env = [("KUBECONFIG", kubeconfig.as_str())];
            run_to_end(
                &[
                    "drain",
                    "--deployment",
                    "again",
                    "--namespace",
                    &ns,
                    "--timeout",
                    "30s",
                ],
                &env,
            )
        }
    });
    // Once it is marked for deletion, let it go (what the garbage collector would do once
    // its pods are gone) and create a new one at once.
    let marked = std::time::Instant::now();
    while rt
        .block_on(api.get("again"))
        .map_or(true, |d| d.metadata.deletion_timestamp.is_none())
    {
        assert!(marked.elapsed() < Duration::from_secs(20), "never deleted");
        std::thread::sleep(Duration::from_millis(20));
    }
    let unfinalize = kube::api::Patch::Merge(serde_json::json!({"metadata": {"finalizers": null}}));
    rt.block_on(api.patch("again", &kube::api::PatchParams::default(), &unfinalize))
        .unwrap_or_else(|e| panic!("patch: {e}"));
    let recreated = std::time::Instant::now();
    loop {
        match rt.block_on(api.create(&Default::default(), &again)) {
            Ok(_) => break,
            Err(e) => assert!(
                recreated.elapsed() < Duration::from_secs(10),
                "recreate: {e}"
            ),
        }
    }
    let (code, out, err) = drain.join().expect("drain thread");
    assert_eq!(
        code, 0,
        "the drain waited on the recreated Deployment: {out}{err}"
    );
    let new = rt
        .block_on(api.get("again"))
        .unwrap_or_else(|e| panic!("get: {e}"));
    assert!(
        new.metadata.deletion_timestamp.is_none(),
        "the recreated Deployment was deleted too: {new:?}"
    );

    // A user without the permission: the API server's refusal, exit 4, one line.
    let tester = server.tester_kubeconfig().display().to_string();
    let (code, _, err) = run_to_end(
        &["drain", "--deployment", "worker", "--namespace", &ns],
        &[("KUBECONFIG", tester.as_str())],
    );
    assert_eq!(code, 4, "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.starts_with(&format!("tenure: cannot read deployment {ns}/worker: "))
            && err.trim_end().ends_with("(403)")
            && !err.contains("Status"),
        "{err}"
    );

    // No Kubernetes configuration: exit 4, one line.
    let (code, _, err) = run_to_end(
        &["drain", "--deployment", "worker", "--namespace", &ns],
        &[("KUBECONFIG", "/nonexistent/kubeconfig")],
    );
    assert_eq!(code, 4, "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");

    for (args, flag) in [
        (vec!["--deployment", "Worker"], "--deployment"),
        (
            vec!["--deployment", "w", "--namespace", "a.b"],
            "--namespace",
        ),
        (vec!["--deployment", "w", "--timeout", "5"], "--timeout"),
    ] {
        let mut all = vec!["drain"];
        all.extend(args);
        let (code, out, err) = run_to_end(&all, &env);
        assert_eq!(code, 2, "{all:?}: {err}");
        assert!(out.is_empty(), "{out}");
        let lines: Vec<&str> = err.lines().collect();
        assert_eq!(lines.len(), 1, "one line: {err}");
        assert!(lines[0].starts_with(&format!("tenure: {flag}: ")), "{err}");
    }
}
