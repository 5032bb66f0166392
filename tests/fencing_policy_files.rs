//! The Helm chart's copy of the fencing policy's CEL (`charts/tenure/files/fencing-cel.yaml`)
//! is exactly what `tenure::fence::kube::FencingPolicy` generates: the same bytes as its
//! `variables` and `validations` serialized, parsing back into the same values, and the same
//! for every election (so one file serves every release). The chart's templates include it
//! verbatim; `tests/helm_chart.rs` compares the rendered policy with the generator's.
//!
//! Regenerate the file with `TENURE_BLESS=1 cargo test --all-features --test
//! fencing_policy_files` after changing the generator's CEL.

use std::path::PathBuf;

use k8s_openapi::api::admissionregistration::v1::{Validation, Variable};
use serde::{Deserialize, Serialize};
use tenure::fence::kube::FencingPolicy;

const BLESS_HINT: &str =
    "regenerate with `TENURE_BLESS=1 cargo test --all-features --test fencing_policy_files`";

/// The file's first lines; the rest is the YAML of [`Cel`].
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

fn path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("charts/tenure/files/fencing-cel.yaml")
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

fn generated_text() -> String {
    let body = serde_saphyr::to_string(&cel_of(&chart_like()))
        .unwrap_or_else(|e| panic!("serialize the CEL: {e}"));
    format!("{HEADER}{body}")
}

#[test]
fn the_charts_cel_is_the_generators_output() {
    let generated = generated_text();
    let path = path();
    if std::env::var_os("TENURE_BLESS").is_some_and(|v| v == "1") {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        }
        std::fs::write(&path, &generated).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    }
    let committed = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e}; {BLESS_HINT}", path.display()));
    // Parsed first, so a drift names the first differing expression rather than bytes.
    let parsed: Cel = serde_saphyr::from_str(&committed)
        .unwrap_or_else(|e| panic!("{} does not parse: {e}; {BLESS_HINT}", path.display()));
    let expected = cel_of(&chart_like());
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
    // The per-election parts live elsewhere: the participants in matchConditions, the
    // Lease in the binding's paramRef.
    let spec = chart_like().policy().spec.expect("spec");
    let conditions = spec.match_conditions.expect("matchConditions");
    assert_eq!(
        conditions[0].expression,
        "request.userInfo.username in ['system:serviceaccount:apps:demo-tenure']"
    );
}
