//! `tenure policy`: the fencing policy of one election as YAML, or with `--check` the proof
//! that the API server enforces it.

use crate::args::PolicyArgs;
use crate::error::CliError;

/// `tenure policy`: prints the anchor, the election's Lease, fencing policy and binding, and the
/// participants' RBAC (their Lease, impersonating themselves with the token's extra); with
/// `--check`, proves the API server enforces them.
pub async fn policy(args: &PolicyArgs) -> Result<u8, CliError> {
    use tenure::fence::kube::{FencingPolicy, PolicyError};
    let flag = |flag: &str, e: PolicyError| CliError::Config {
        message: format!("{flag}: {e}"),
    };
    let mut spec = FencingPolicy::new(&args.namespace, &args.lease).map_err(|e| {
        let namespace = matches!(
            &e,
            PolicyError::Invalid {
                what: "namespace",
                ..
            }
        );
        flag(if namespace { "--namespace" } else { "--lease" }, e)
    })?;
    let default_sa = ["tenure".to_owned()];
    let service_accounts = if args.service_accounts.is_empty() && args.users.is_empty() {
        &default_sa[..]
    } else {
        &args.service_accounts[..]
    };
    for sa in service_accounts {
        let (ns, name) = sa.split_once('/').unwrap_or((&args.namespace, sa));
        spec = spec
            .service_account(ns, name)
            .map_err(|e| flag("--service-account", e))?;
    }
    for user in &args.users {
        spec = spec.user(user).map_err(|e| flag("--user", e))?;
    }
    for resource in &args.resources {
        spec = spec.resource(resource).map_err(|e| flag("--resource", e))?;
    }
    if let Some(shards) = args.shards {
        spec = spec.shards(shards).map_err(|e| flag("--shards", e))?;
    }
    if args.prefer.is_some() || args.health_cmd.is_some() {
        spec = spec.member_leases();
    }
    if !args.check {
        print!("{}---\n{}", spec.to_yaml(), spec.worker_rbac_yaml());
        return Ok(0);
    }
    // The first participant speaks for all: the policy matches them alike.
    let participant = service_accounts
        .first()
        .map(|sa| {
            let (ns, name) = sa.split_once('/').unwrap_or((&args.namespace, sa));
            tenure::fence::kube::Participant::new(format!("system:serviceaccount:{ns}:{name}"))
        })
        .or_else(|| {
            args.users.first().map(|u| {
                args.groups
                    .iter()
                    .fold(tenure::fence::kube::Participant::new(u.clone()), |p, g| {
                        p.group(g.clone())
                    })
            })
        })
        .unwrap_or_else(|| tenure::fence::kube::Participant::new(String::new()));
    if !args.groups.is_empty() && !service_accounts.is_empty() {
        return Err(CliError::Config {
            message: "--group applies to a --user participant; a ServiceAccount's groups follow from its name (give --user without --service-account)".into(),
        });
    }
    let client = crate::backend::kube_client("tenure policy --check").await?;
    let lease = match args.shards {
        Some(_) => format!("sharded group {}/{}", args.namespace, args.lease),
        None => format!("lease {}/{}", args.namespace, args.lease),
    };
    match tenure::fence::kube::check(&client, &spec, &participant).await {
        Ok(tenure::fence::kube::CheckVerdict::Enforced { floor }) => {
            println!(
                "fence on {lease} enforced by the API server (floor {floor}: a lower token refused, the floor's admitted; checked as {participant})"
            );
            Ok(0)
        }
        Ok(tenure::fence::kube::CheckVerdict::ShardsEnforced { floors }) => {
            let lowest = floors.iter().map(|(_, f)| *f).min().unwrap_or(0);
            let highest = floors.iter().map(|(_, f)| *f).max().unwrap_or(0);
            println!(
                "fence on {lease} enforced by the API server on each of its {} shard Leases (floors {lowest} to {highest}: on each, a lower token refused and the floor's admitted; a write naming no shard refused; checked as {participant})",
                floors.len()
            );
            Ok(0)
        }
        Ok(tenure::fence::kube::CheckVerdict::Open { message, .. }) => Err(CliError::FenceOpen {
            message: format!(
                "fence on {lease} is not enforced (checked as {participant}): {message}"
            ),
        }),
        Ok(other) => Err(CliError::Internal {
            message: format!("unexpected verdict {other:?}"),
        }),
        Err(e) => Err(CliError::Backend {
            message: format!("cannot check the fence on {lease}: {e}"),
        }),
    }
}
