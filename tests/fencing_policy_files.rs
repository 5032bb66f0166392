//! The Helm chart's copies of the fencing policy's CEL (`charts/tenure/files/fencing-cel.yaml`
//! for one election, `fencing-cel-shards.yaml` for a sharded group) are exactly what
//! `tenure::fence::kube::FencingPolicy` generates: the same bytes as its `variables` and
//! `validations` serialized, parsing back into the same values, and the same for every
//! election and every group, whatever its count (so one file serves every release). The
//! chart's templates include them verbatim; `tests/helm_chart.rs` compares the rendered policy
//! with the generator's.
//!
//! Regenerate the file with `TENURE_BLESS=1 cargo test --all-features --test
//! fencing_policy_files` after changing the generator's CEL.

use std::path::PathBuf;

use k8s_openapi::api::admissionregistration::v1::{Validation, Variable};
use serde::{Deserialize, Serialize};
use tenure::fence::kube::FencingPolicy;

const BLESS_HINT: &str =
    "regenerate with `TENURE_BLESS=1 cargo test --all-features --test fencing_policy_files`";

/// The first lines of the file of one election's policy; the rest is the YAML of [`Cel`].
const HEADER: &str = "\
# The CEL of tenure's fencing ValidatingAdmissionPolicy (`variables` and `validations` of its
# spec), exactly as tenure::fence::kube::FencingPolicy::policy() generates them; the same for
# every election. Included verbatim by templates/fencing-policy.yaml.
# Do not edit: regenerate with `TENURE_BLESS=1 cargo test --all-features --test fencing_policy_files`.
";

/// What the file holds: two fields of the policy's spec, in this order.
#[derive(Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Cel {
    variables: Vec<Variable>,
    validations: Vec<Validation>,
}

/// The first lines of the file of a sharded group's policy.
const SHARDS_HEADER: &str = "\
# The CEL of tenure's fencing ValidatingAdmissionPolicy for a sharded group (`variables` and
# `validations` of its spec), exactly as tenure::fence::kube::FencingPolicy::shards(N).policy()
# generates them; the same for every group and count. Included verbatim by
# templates/fencing-policy.yaml with sharding.shards.
# Do not edit: regenerate with `TENURE_BLESS=1 cargo test --all-features --test fencing_policy_files`.
";

fn path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("charts/tenure/files/fencing-cel.yaml")
}

fn shards_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("charts/tenure/files/fencing-cel-shards.yaml")
}

/// The generator's CEL for `policy`.
fn cel_of(policy: &FencingPolicy) -> Cel {
    let spec = policy.policy().spec.expect("the policy has a spec");
    Cel {
        variables: spec.variables.expect("variables"),
        validations: spec.validations.expect("validations"),
    }
}

/// A policy like the chart's: its ServiceAccount, every resource.
fn chart_like() -> FencingPolicy {
    FencingPolicy::new("apps", "demo-tenure")
        .and_then(|p| p.service_account("apps", "demo-tenure"))
        .expect("valid policy")
}

/// A sharded group like the chart's (`sharding.shards`).
fn chart_like_group() -> FencingPolicy {
    chart_like().shards(4).expect("valid count")
}

fn generated_text(header: &str, policy: &FencingPolicy) -> String {
    let body = serde_saphyr::to_string(&cel_of(policy))
        .unwrap_or_else(|e| panic!("serialize the CEL: {e}"));
    format!("{header}{body}")
}

#[test]
fn the_charts_cel_is_the_generators_output() {
    assert_file_is_generated(&path(), HEADER, &chart_like());
}

#[test]
fn the_charts_sharded_cel_is_the_generators_output() {
    assert_file_is_generated(&shards_path(), SHARDS_HEADER, &chart_like_group());
    // Not the single election's: the chart must pick the right one.
    assert_ne!(cel_of(&chart_like_group()), cel_of(&chart_like()));
}

/// `path` (blessed first with `TENURE_BLESS=1`) is `header` and `policy`'s CEL serialized.
fn assert_file_is_generated(path: &std::path::Path, header: &str, policy: &FencingPolicy) {
    let generated = generated_text(header, policy);
    if std::env::var_os("TENURE_BLESS").is_some_and(|v| v == "1") {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        }
        std::fs::write(path, &generated).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    }
    let committed = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{}: {e}; {BLESS_HINT}", path.display()));
    // Parsed first, so a drift names the first differing expression rather than bytes.
    let parsed: Cel = serde_saphyr::from_str(&committed)
        .unwrap_or_else(|e| panic!("{} does not parse: {e}; {BLESS_HINT}", path.display()));
    let expected = cel_of(policy);
    for (i, (file, generator)) in parsed.variables.iter().zip(&expected.variables).enumerate() {
        assert_eq!(
            file,
            generator,
            "variable {i} of {} differs from the generator's; {BLESS_HINT}",
            path.display()
        );
    }
    for (i, (file, generator)) in parsed
        .validations
        .iter()
        .zip(&expected.validations)
        .enumerate()
    {
        assert_eq!(
            file,
            generator,
            "validation {i} of {} differs from the generator's; {BLESS_HINT}",
            path.display()
        );
    }
    assert_eq!(
        parsed,
        expected,
        "{} differs from the generator's CEL; {BLESS_HINT}",
        path.display()
    );
    // And byte for byte (the header, the serializer's layout): a hand edit that parses the
    // same is still an edit.
    assert!(
        committed == generated,
        "{} is not the generator's serialization byte for byte; {BLESS_HINT}",
        path.display()
    );
}

#[test]
fn the_cel_is_the_same_for_every_election() {
    let reference = cel_of(&chart_like());
    let others = [
        FencingPolicy::new("ops", "reports-controller")
            .and_then(|p| p.service_account("ops", "reports"))
            .and_then(|p| p.resource("configmaps"))
            .and_then(|p| p.resource("deployments.apps")),
        FencingPolicy::new("x", "a.b.c")
            .and_then(|p| p.user("alice@example.com"))
            .and_then(|p| p.service_account("other", "sa"))
            .and_then(|p| p.resource("widgets.example.com")),
    ];
    for policy in others {
        let policy = policy.expect("valid policy");
        assert_eq!(
            cel_of(&policy),
            reference,
            "the CEL of {} depends on its inputs: one chart file cannot serve every release",
            policy.name()
        );
    }
    // And a sharded group's: the same for every group and count.
    let group_reference = cel_of(&chart_like_group());
    let groups = [
        FencingPolicy::new("ops", "reports-controller")
            .and_then(|p| p.service_account("ops", "reports"))
            .and_then(|p| p.resource("configmaps"))
            .and_then(|p| p.shards(1)),
        FencingPolicy::new("x", "a.b.c")
            .and_then(|p| p.user("alice@example.com"))
            .and_then(|p| p.shards(tenure::shard::MAX_SHARDS)),
    ];
    for policy in groups {
        let policy = policy.expect("valid policy");
        assert_eq!(
            cel_of(&policy),
            group_reference,
            "the CEL of group {} depends on its inputs: one chart file cannot serve every release",
            policy.name()
        );
    }
    // The per-election parts live elsewhere: the participants in matchConditions, the
    // Lease in the binding's paramRef.
    let spec = chart_like().policy().spec.expect("spec");
    let conditions = spec.match_conditions.expect("matchConditions");
    assert_eq!(
        conditions[0].expression,
        "request.userInfo.username in ['system:serviceaccount:apps:demo-tenure']"
    );
}
