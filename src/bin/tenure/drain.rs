//! `tenure drain`: stop a Deployment's replicas and wait until their pods are gone, while
//! their permissions still exist, so each leader's release on SIGTERM is allowed.
//!
//! The Helm chart runs it as a pre-delete hook. Helm deletes a release's objects in one pass:
//! the Deployment first, then the RoleBinding, Role and ServiceAccount, within milliseconds.
//! The pods stop only afterwards (the garbage collector deletes them, then their grace period
//! runs), so without the hook a leader's release is refused — its token's ServiceAccount is
//! gone — and the Lease names it until it expires. Deleting the Deployment with *foreground*
//! propagation makes the API server keep it until its ReplicaSets, and their pods, are gone;
//! waiting for the Deployment to disappear is waiting for the last pod to have stopped.

use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use kube::api::{Api, DeleteParams, Preconditions};

use crate::args::DrainArgs;
use crate::args::is_dns1123;
use crate::error::CliError;

/// How often the Deployment is looked up while its pods stop.
const POLL: Duration = Duration::from_millis(250);

/// Deletes the Deployment (foreground) and waits until it is gone. 0 when gone (or gone
/// already); 4 when the API refused or could not be reached; 1 at `--timeout`.
pub async fn drain(args: DrainArgs) -> Result<u8, CliError> {
    let timeout = tenure::crd::parse_duration(&args.timeout).map_err(|e| CliError::Config {
        message: format!("--timeout: {e}"),
    })?;
    if !is_dns1123(&args.deployment, 253, true) {
        return Err(CliError::Config {
            message: format!(
                "--deployment: {:?} is not a Kubernetes object name (lowercase letters, digits, '-' and '.', at most 253 characters)",
                args.deployment
            ),
        });
    }
    if let Some(ns) = &args.namespace
        && !is_dns1123(ns, 63, false)
    {
        return Err(CliError::Config {
            message: format!(
                "--namespace: {ns:?} is not a namespace name (lowercase letters, digits and '-', at most 63 characters)"
            ),
        });
    }
    let client = crate::backend::kube_client("drain").await?;
    let namespace = args
        .namespace
        .clone()
        .unwrap_or_else(|| client.default_namespace().to_owned());
    let deployments: Api<Deployment> = Api::namespaced(client, &namespace);
    let what = format!("deployment {namespace}/{}", args.deployment);
    // The API server's own message and code, not kube's Display (which repeats the message
    // and dumps the whole Status).
    let api_error = |doing: &str, e: kube::Error| CliError::Backend {
        message: match &e {
            kube::Error::Api(s) => format!("{doing} {what}: {} ({})", s.message, s.code),
            other => format!("{doing} {what}: {}", crate::error::chain(other)),
        },
    };
    let started = Instant::now();
    // The Deployment is followed by its UID: one recreated under the same name while this one
    // drains (a `helm install` right after an uninstall) is another object, and waiting for it
    // would wait for pods that are not this release's.
    let uid = match deployments.get_opt(&args.deployment).await {
        Ok(None) => {
            println!("{what} is already gone");
            return Ok(0);
        }
        Ok(Some(d)) => d.metadata.uid.unwrap_or_default(),
        Err(e) => return Err(api_error("cannot read", e)),
    };
    let mut delete = DeleteParams::foreground();
    if !uid.is_empty() {
        delete = delete.preconditions(Preconditions {
            uid: Some(uid.clone()),
            resource_version: None,
        });
    }
    match deployments.delete(&args.deployment, &delete).await {
        Ok(_) => {}
        // Gone meanwhile (404), or replaced by another object of the same name (409, the UID
        // precondition): the one this drain was for is gone either way.
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {
            println!("{what} is already gone");
            return Ok(0);
        }
        Err(e) => return Err(api_error("cannot delete", e)),
    }
    println!("deleting {what}; waiting for its pods to stop");
    loop {
        match deployments.get_opt(&args.deployment).await {
            Ok(None) => break,
            Ok(Some(d)) if d.metadata.uid.as_deref().unwrap_or_default() != uid => {
                println!("{what} was recreated (another UID); the one drained is gone");
                break;
            }
            Ok(Some(_)) => {}
            Err(e) => return Err(api_error("cannot read", e)),
        }
        if started.elapsed() >= timeout {
            return Err(CliError::Internal {
                message: format!("{what} still has pods after --timeout {}", args.timeout),
            });
        }
        tokio::time::sleep(POLL).await;
    }
    println!(
        "{what} and its pods are gone after {:.1} s",
        started.elapsed().as_secs_f64()
    );
    Ok(0)
}
