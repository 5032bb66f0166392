//! `tenure run --check`: the pre-flight of this exact invocation, without campaigning. Each
//! check the run would otherwise meet later — the store answering, on Kubernetes the worker's
//! own permissions on its Lease (and `--once-per`'s record), with `--fence` the impersonation
//! its fenced requests need and the election's policy — is printed on its own line with the
//! fix for a failure. Exit 0 when every check passed, 4 when one failed.

use std::fmt::Write as _;

use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use k8s_openapi::api::authentication::v1::SelfSubjectReview;
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
};
use kube::api::{Api, PostParams};

use crate::args::RunArgs;
use crate::backend::Connected;
use crate::error::{CliError, chain, printable};
use crate::run::setup;

/// One check's verdict.
enum Verdict {
    Pass,
    /// What is wrong, and the fix.
    Fail(String, String),
    /// Could not tell, and why (not a failure: the run itself will find out).
    Unknown(String),
}

/// The lines printed so far, and whether one failed.
#[derive(Default)]
struct Report {
    text: String,
    failed: bool,
}

impl Report {
    fn add(&mut self, what: &str, verdict: Verdict) {
        // Writing to a String cannot fail.
        let _ = match verdict {
            Verdict::Pass => writeln!(self.text, "ok    {what}"),
            Verdict::Fail(why, fix) => {
                self.failed = true;
                writeln!(self.text, "FAIL  {what}: {why}\n      fix: {fix}")
            }
            Verdict::Unknown(why) => writeln!(self.text, "?     {what}: {why}"),
        };
    }
}

/// Runs the checks of `args` and prints them on stdout; the exit code (0 or 4).
pub async fn run(args: &RunArgs) -> Result<u8, CliError> {
    let mut report = Report::default();
    let connected = match setup::connect(args).await {
        Ok((connected, _, _)) => connected,
        Err(e) => {
            report.add(
                "the store",
                Verdict::Fail(
                    e.to_string(),
                    "see the line above: the backend's flags, its address and credentials".into(),
                ),
            );
            return Ok(finish(&report));
        }
    };
    let store = format!(
        "the store ({}) answers a read of lease {}",
        connected.description, args.lease
    );
    match setup::probe(&connected, &args.lease, args.retry_period).await {
        Ok(()) => report.add(&store, Verdict::Pass),
        Err(e) => report.add(
            &store,
            Verdict::Fail(
                e.to_string(),
                "check the address, the credentials and the user's permissions on the store".into(),
            ),
        ),
    }
    if connected.kube.is_some() {
        kube_checks(args, &connected, &mut report).await;
    } else if args.fence {
        report.add(
            "--fence",
            Verdict::Fail(
                format!(
                    "needs --backend kube (this run uses {})",
                    connected.description
                ),
                "drop --fence, or run on the Kubernetes backend".into(),
            ),
        );
    }
    Ok(finish(&report))
}

fn finish(report: &Report) -> u8 {
    print!("{}", report.text);
    if report.failed { 4 } else { 0 }
}

async fn kube_checks(args: &RunArgs, connected: &Connected, report: &mut Report) {
    let Some(kube) = &connected.kube else {
        return;
    };
    let ns = kube.namespace().to_owned();
    let lease = &args.lease;
    let what =
        format!("this user may get, list, watch and update lease {ns}/{lease} and create leases");
    match kube.missing_permissions(lease).await {
        Ok(missing) if missing.is_empty() => report.add(&what, Verdict::Pass),
        Ok(missing) => report.add(
            &what,
            Verdict::Fail(
                format!("missing: {}", missing.join(", ")),
                format!("a Role in {ns} with get, list, watch, update on leases (resourceNames: [{lease}]) and create on leases, bound to this user (the Helm chart's Role does)"),
            ),
        ),
        Err(e) => report.add(&what, Verdict::Unknown(chain(&e))),
    }
    if args.once_per.is_some() {
        let what = format!(
            "--once-per: this user may get and update lease {ns}/{lease}-done (the completion record)"
        );
        match kube.missing_completion_permissions(lease).await {
            Ok(missing) if missing.is_empty() => report.add(&what, Verdict::Pass),
            Ok(missing) => report.add(
                &what,
                Verdict::Fail(
                    format!("missing: {}", missing.join(", ")),
                    format!("add get, update on leases (resourceNames: [{lease}-done]) and create on leases to the worker's Role (the chart's job.oncePer does)"),
                ),
            ),
            Err(e) => report.add(&what, Verdict::Unknown(chain(&e))),
        }
    }
    if args.fence {
        fence_checks(&ns, lease, report).await;
    }
}

/// `--fence`: the impersonation of itself its fenced requests need, and the policy.
async fn fence_checks(ns: &str, lease: &str, report: &mut Report) {
    let client = match crate::backend::kube_client("--fence").await {
        Ok(c) => c,
        Err(e) => {
            report.add(
                "--fence: a Kubernetes client",
                Verdict::Fail(e.to_string(), "set KUBECONFIG or run in a pod".into()),
            );
            return;
        }
    };
    let review: Api<SelfSubjectReview> = Api::all(client.clone());
    let user = match review
        .create(&PostParams::default(), &SelfSubjectReview::default())
        .await
    {
        Ok(r) => r
            .status
            .and_then(|s| s.user_info)
            .and_then(|u| u.username)
            .unwrap_or_default(),
        Err(e) => {
            report.add(
                "--fence: who this user is (SelfSubjectReview)",
                Verdict::Unknown(e.to_string()),
            );
            return;
        }
    };
    if user.is_empty() {
        report.add(
            "--fence: who this user is",
            Verdict::Fail(
                "the API server names no user (anonymous?)".into(),
                "authenticate: a ServiceAccount token or a kubeconfig user".into(),
            ),
        );
        return;
    }
    let shown = printable(&user).into_owned();
    // Its own identity: a ServiceAccount by name in its namespace, or a user by name.
    let own = match user
        .strip_prefix("system:serviceaccount:")
        .and_then(|r| r.split_once(':'))
    {
        Some((sa_ns, sa)) => attrs("impersonate", "", "serviceaccounts", Some(sa_ns), Some(sa)),
        None => attrs("impersonate", "", "users", None, Some(&user)),
    };
    let rule = |a: &ResourceAttributes| {
        format!(
            "{} {}{}{}{}",
            a.verb.as_deref().unwrap_or_default(),
            a.resource.as_deref().unwrap_or_default(),
            a.subresource
                .as_deref()
                .map(|s| format!("/{s}"))
                .unwrap_or_default(),
            a.name
                .as_deref()
                .map(|n| format!("/{n}"))
                .unwrap_or_default(),
            a.namespace
                .as_deref()
                .map(|n| format!(" in {n}"))
                .unwrap_or_default(),
        )
    };
    let extras = ["tenure.dev/fencing-token", "tenure.dev/fencing-election"].map(|extra| {
        ResourceAttributes {
            // RBAC's `userextras/KEY` is the resource userextras, subresource KEY.
            subresource: Some(extra.to_owned()),
            ..attrs(
                "impersonate",
                "authentication.k8s.io",
                "userextras",
                None,
                None,
            )
        }
    });
    let own_fix = "a Role (or ClusterRole) granting impersonate on this user's own ServiceAccount, by name; `tenure policy` prints it, the chart's fencing.impersonation grants it";
    let extra_fix = format!(
        "the election's ClusterRole tenure-fencing.{ns}.{lease} (impersonate on userextras/tenure.dev/fencing-token and userextras/tenure.dev/fencing-election) bound to this user; `tenure policy` prints it, the chart grants it"
    );
    for (a, fix) in
        std::iter::once((own, own_fix)).chain(extras.into_iter().map(|a| (a, extra_fix.as_str())))
    {
        let what = format!("--fence: {shown} may {}", rule(&a));
        match may(&client, a.clone()).await {
            Ok(true) => report.add(&what, Verdict::Pass),
            Ok(false) => report.add(
                &what,
                Verdict::Fail(format!("missing permission: {}", rule(&a)), fix.to_owned()),
            ),
            Err(e) => report.add(&what, Verdict::Unknown(e.to_string())),
        }
    }
    let name = format!("tenure-fencing.{ns}.{lease}");
    let what = format!("--fence: the fencing policy and binding {name} exist");
    let policies: Api<ValidatingAdmissionPolicy> = Api::all(client.clone());
    let bindings: Api<ValidatingAdmissionPolicyBinding> = Api::all(client);
    let install = format!(
        "as cluster-admin: tenure policy --lease {lease} --namespace {ns} --service-account SA | kubectl apply -f - (or the chart's fencing.policy.enabled)"
    );
    match (policies.get_opt(&name).await, bindings.get_opt(&name).await) {
        (Ok(Some(_)), Ok(Some(_))) => report.add(&what, Verdict::Pass),
        (Ok(p), Ok(b)) => {
            let gone: Vec<&str> = [(p.is_none(), "the policy"), (b.is_none(), "the binding")]
                .into_iter()
                .filter_map(|(gone, w)| gone.then_some(w))
                .collect();
            report.add(&what, Verdict::Fail(format!("missing: {}", gone.join(" and ")), install));
        }
        (Err(kube::Error::Api(s)), _) | (_, Err(kube::Error::Api(s))) if s.code == 403 => report.add(
            &what,
            Verdict::Unknown("this user may not read validatingadmissionpolicies (it need not: each term's fence proof checks the policy, exit 8 without it)".into()),
        ),
        (Err(e), _) | (_, Err(e)) => report.add(&what, Verdict::Unknown(e.to_string())),
    }
}

fn attrs(
    verb: &str,
    group: &str,
    resource: &str,
    namespace: Option<&str>,
    name: Option<&str>,
) -> ResourceAttributes {
    ResourceAttributes {
        verb: Some(verb.to_owned()),
        group: Some(group.to_owned()),
        resource: Some(resource.to_owned()),
        namespace: namespace.map(str::to_owned),
        name: name.map(str::to_owned),
        ..ResourceAttributes::default()
    }
}

/// Whether this client's user may do `attrs` (a SelfSubjectAccessReview).
async fn may(client: &kube::Client, attrs: ResourceAttributes) -> Result<bool, kube::Error> {
    let reviews: Api<SelfSubjectAccessReview> = Api::all(client.clone());
    let review = SelfSubjectAccessReview {
        spec: SelfSubjectAccessReviewSpec {
            resource_attributes: Some(attrs),
            ..SelfSubjectAccessReviewSpec::default()
        },
        ..SelfSubjectAccessReview::default()
    };
    let answer = reviews.create(&PostParams::default(), &review).await?;
    Ok(answer.status.is_some_and(|s| s.allowed))
}
