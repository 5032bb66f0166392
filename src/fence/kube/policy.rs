//! The ValidatingAdmissionPolicy that makes the API server refuse a stale leader's writes:
//! generated for one election from its Lease, its participants and the resources it governs.

use std::collections::BTreeMap;

use k8s_openapi::api::admissionregistration::v1::{
    MatchCondition, MatchResources, NamedRuleWithOperations, ParamKind, ParamRef,
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
    ValidatingAdmissionPolicyBindingSpec, ValidatingAdmissionPolicySpec, Validation, Variable,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::{OBJECT_TOKEN_ANNOTATION, REFUSAL_PREFIX, REQUEST_TOKEN_EXTRA};
use crate::backend::kube::record;

/// A write to a governed object that the policy checks.
const OPERATIONS: [&str; 3] = ["CREATE", "UPDATE", "DELETE"];

/// A policy spec that [`FencingPolicy::policy`] and [`FencingPolicy::binding`] turn into the
/// two objects to apply: for one election (a Lease), the participants whose writes are
/// fenced, and the resources those writes go to.
///
/// What the API server then enforces, for requests whose user is a participant (people and
/// other controllers are never affected):
///
/// - a create, update, patch, apply, status write or delete of a governed object must carry
///   the writer's fencing token in the request (the user extra `tenure.dev/fencing-token`,
///   which [`Fencer`](super::Fencer) sends by impersonating its own identity);
/// - it is refused when that token is lower than the current term's (the Lease's
///   `tenure.dev/fencing-floor`, raised by the very write that grants a term), or lower than
///   the token already on the object (its `tenure.dev/fencing-token` annotation);
/// - while a replica that does not stamp tokens (client-go) holds the Lease, writes without a
///   token are admitted (that replica cannot send one) and every write *with* a token is
///   refused (no tenure replica leads, so any such writer is stale);
/// - while the Lease does not exist, nothing is fenced (`parameterNotFoundAction: Allow`;
///   see the module docs for why not `Deny`): install it with the policy
///   ([`lease`](Self::lease), which [`to_yaml`](Self::to_yaml) includes), and it exists from
///   then on.
///
/// # Example
///
/// ```
/// use tenure::fence::kube::FencingPolicy;
///
/// let spec = FencingPolicy::new("ops", "reports-controller")?
///     .service_account("ops", "reports")?
///     .resource("configmaps")?
///     .resource("deployments.apps")?;
/// let policy = spec.policy();
/// assert_eq!(policy.metadata.name.as_deref(), Some("tenure-fencing.ops.reports-controller"));
/// assert_eq!(spec.binding().spec.param_ref.and_then(|p| p.name).as_deref(),
///            Some("reports-controller"));
/// # Ok::<(), tenure::fence::kube::PolicyError>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FencingPolicy {
    namespace: String,
    lease: String,
    users: Vec<String>,
    resources: Vec<GovernedResource>,
}

/// One governed resource, as `resource[.group]` (kubectl's spelling: `configmaps`,
/// `deployments.apps`, `widgets.example.com`).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct GovernedResource {
    group: String,
    resource: String,
}

/// A policy input that Kubernetes would not accept.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PolicyError {
    /// A name (namespace, lease, service account, resource, user) breaks its rule.
    #[error("invalid {what} {value:?}: {rule}")]
    Invalid {
        /// What the value names: `namespace`, `lease`, `service account`, `resource`, `user`.
        what: &'static str,
        /// The value given.
        value: String,
        /// The rule it breaks.
        rule: String,
    },
}

fn invalid(what: &'static str, value: &str, rule: impl Into<String>) -> PolicyError {
    PolicyError::Invalid {
        what,
        value: value.to_owned(),
        rule: rule.into(),
    }
}

/// A DNS-1123 label: what namespaces and resource names are.
fn check_label(what: &'static str, value: &str) -> Result<(), PolicyError> {
    if record::is_dns1123_label(value) {
        Ok(())
    } else {
        Err(invalid(
            what,
            value,
            "must be a DNS-1123 label: 1-63 lowercase alphanumeric characters or '-', \
             starting and ending with an alphanumeric character",
        ))
    }
}

/// A DNS-1123 subdomain: what Lease, ServiceAccount and API group names are.
fn check_subdomain(what: &'static str, value: &str) -> Result<(), PolicyError> {
    record::validate_name(value).map_err(|_| {
        invalid(
            what,
            value,
            "must be a DNS-1123 subdomain: at most 253 lowercase alphanumeric characters, '-' \
             or '.', each '.'-separated part starting and ending with an alphanumeric character",
        )
    })
}

impl FencingPolicy {
    /// The policy for the election whose Lease is `namespace/lease`. Add at least one
    /// participant ([`service_account`](Self::service_account) or [`user`](Self::user));
    /// without [`resource`](Self::resource) it governs every resource but the ones the
    /// election itself writes (Leases, Events, `Election` resources, access reviews).
    ///
    /// # Errors
    ///
    /// [`PolicyError::Invalid`] for a namespace that is not a DNS-1123 label or a lease name
    /// that is not a DNS-1123 subdomain of at most 63 characters (it is also a label value
    /// on the policy).
    pub fn new(namespace: &str, lease: &str) -> Result<Self, PolicyError> {
        check_label("namespace", namespace)?;
        check_subdomain("lease", lease)?;
        if lease.len() > 63 {
            return Err(invalid(
                "lease",
                lease,
                "a fenced election's lease name must be at most 63 characters (it is a label \
                 value on the policy)",
            ));
        }
        // (With both names this short, the policy's name is well within 253 characters.)
        Ok(Self {
            namespace: namespace.to_owned(),
            lease: lease.to_owned(),
            users: Vec::new(),
            resources: Vec::new(),
        })
    }

    /// Adds the ServiceAccount `namespace/name` as a participant: its writes are fenced.
    ///
    /// # Errors
    ///
    /// [`PolicyError::Invalid`] when `namespace` is not a DNS-1123 label or `name` not a
    /// DNS-1123 subdomain.
    pub fn service_account(self, namespace: &str, name: &str) -> Result<Self, PolicyError> {
        check_label("namespace", namespace)?;
        check_subdomain("service account", name)?;
        Ok(self.push_user(format!("system:serviceaccount:{namespace}:{name}")))
    }

    /// Adds the user `name` (as the API server authenticates it) as a participant.
    ///
    /// # Errors
    ///
    /// [`PolicyError::Invalid`] when `name` is empty, has control characters or a `'`
    /// (it is quoted inside the policy's CEL).
    pub fn user(self, name: &str) -> Result<Self, PolicyError> {
        if name.is_empty()
            || name
                .chars()
                .any(|c| c.is_control() || c == '\'' || c == '\\')
        {
            return Err(invalid(
                "user",
                name,
                "must be non-empty, without control characters, quotes or backslashes",
            ));
        }
        Ok(self.push_user(name.to_owned()))
    }

    fn push_user(mut self, user: String) -> Self {
        if !self.users.contains(&user) {
            self.users.push(user);
        }
        self
    }

    /// Governs `resource` (`configmaps`, `deployments.apps`, `widgets.example.com`): its
    /// objects and all their subresources (`status`, `scale`, …).
    ///
    /// # Errors
    ///
    /// [`PolicyError::Invalid`] when the resource part is not a DNS-1123 label or the group
    /// part not a DNS-1123 subdomain.
    pub fn resource(mut self, resource: &str) -> Result<Self, PolicyError> {
        let (name, group) = resource.split_once('.').unwrap_or((resource, ""));
        check_label("resource", name).map_err(|_| {
            invalid(
                "resource",
                resource,
                "must be `resource[.group]` (e.g. configmaps, deployments.apps): the resource \
                 a lowercase plural name, the group a DNS subdomain",
            )
        })?;
        // `deployments.` names no group: refuse it rather than read it as the core group.
        if resource.contains('.') {
            check_subdomain("resource", group)?;
        }
        let governed = GovernedResource {
            group: group.to_owned(),
            resource: name.to_owned(),
        };
        if !self.resources.contains(&governed) {
            self.resources.push(governed);
            self.resources.sort();
        }
        Ok(self)
    }

    /// The name of the policy and of its binding: `tenure-fencing.<namespace>.<lease>`
    /// (cluster-scoped objects, so the namespace is part of it).
    #[must_use]
    pub fn name(&self) -> String {
        format!("tenure-fencing.{}.{}", self.namespace, self.lease)
    }

    fn metadata(&self) -> ObjectMeta {
        ObjectMeta {
            name: Some(self.name()),
            labels: Some(BTreeMap::from([
                (
                    "app.kubernetes.io/managed-by".to_owned(),
                    "tenure".to_owned(),
                ),
                ("tenure.dev/lease".to_owned(), self.lease.clone()),
                (
                    "tenure.dev/lease-namespace".to_owned(),
                    self.namespace.clone(),
                ),
            ])),
            ..ObjectMeta::default()
        }
    }

    /// The `ValidatingAdmissionPolicy` (admissionregistration.k8s.io/v1).
    #[must_use]
    pub fn policy(&self) -> ValidatingAdmissionPolicy {
        ValidatingAdmissionPolicy {
            metadata: self.metadata(),
            spec: Some(ValidatingAdmissionPolicySpec {
                failure_policy: Some("Fail".to_owned()),
                param_kind: Some(ParamKind {
                    api_version: Some("coordination.k8s.io/v1".to_owned()),
                    kind: Some("Lease".to_owned()),
                }),
                match_constraints: Some(self.match_resources()),
                match_conditions: Some(vec![MatchCondition {
                    name: "election-participant".to_owned(),
                    expression: self.participant_expression(),
                }]),
                variables: Some(variables()),
                validations: Some(validations()),
                ..ValidatingAdmissionPolicySpec::default()
            }),
            status: None,
        }
    }

    /// The `ValidatingAdmissionPolicyBinding` that applies the policy with the election's
    /// Lease as its parameter. While the Lease is missing nothing is fenced (see the type's
    /// docs): install [`lease`](Self::lease) with it.
    #[must_use]
    pub fn binding(&self) -> ValidatingAdmissionPolicyBinding {
        ValidatingAdmissionPolicyBinding {
            metadata: self.metadata(),
            spec: ValidatingAdmissionPolicyBindingSpec {
                policy_name: self.name(),
                param_ref: Some(ParamRef {
                    name: Some(self.lease.clone()),
                    namespace: Some(self.namespace.clone()),
                    // Not Deny: the parameter is resolved before matchConditions, so a
                    // missing Lease would refuse every writer (see the module docs).
                    parameter_not_found_action: Some("Allow".to_owned()),
                    selector: None,
                }),
                validation_actions: vec!["Deny".to_owned()],
                match_resources: None,
            },
        }
    }

    /// The election's Lease, empty (no holder, no token), to create with the policy so the
    /// policy has its parameter from the start. Applying it over an existing Lease changes
    /// nothing tenure wrote: it sets no spec field.
    #[must_use]
    pub fn lease(&self) -> k8s_openapi::api::coordination::v1::Lease {
        k8s_openapi::api::coordination::v1::Lease {
            metadata: ObjectMeta {
                name: Some(self.lease.clone()),
                namespace: Some(self.namespace.clone()),
                ..ObjectMeta::default()
            },
            spec: None,
        }
    }

    /// The Lease, the policy and the binding as one YAML stream, ready for
    /// `kubectl apply -f -` (what `tenure policy` prints).
    #[cfg(feature = "crd")]
    #[must_use]
    pub fn to_yaml(&self) -> String {
        fn one<T: serde::Serialize>(object: &T) -> String {
            // Unreachable in practice (plain data); JSON is valid YAML.
            serde_saphyr::to_string(object)
                .or_else(|_| serde_json::to_string_pretty(object))
                .unwrap_or_default()
        }
        let mut lease = serde_json::to_value(self.lease()).unwrap_or_default();
        let mut policy = serde_json::to_value(self.policy()).unwrap_or_default();
        let mut binding = serde_json::to_value(self.binding()).unwrap_or_default();
        // k8s-openapi's types serialize without apiVersion/kind; kubectl needs them.
        for (value, api_version, kind) in [
            (&mut lease, "coordination.k8s.io/v1", "Lease"),
            (
                &mut policy,
                "admissionregistration.k8s.io/v1",
                "ValidatingAdmissionPolicy",
            ),
            (
                &mut binding,
                "admissionregistration.k8s.io/v1",
                "ValidatingAdmissionPolicyBinding",
            ),
        ] {
            if let Some(map) = value.as_object_mut() {
                map.insert("apiVersion".into(), api_version.into());
                map.insert("kind".into(), kind.into());
            }
        }
        format!(
            "# tenure fencing policy for lease {}/{}: generated by `tenure policy`; do not edit.\n\
             # The Lease comes first: the policy reads it as its parameter.\n{}---\n{}---\n{}",
            self.namespace,
            self.lease,
            one(&lease),
            one(&policy),
            one(&binding)
        )
    }

    fn participant_expression(&self) -> String {
        let quoted: Vec<String> = self.users.iter().map(|u| format!("'{u}'")).collect();
        format!("request.userInfo.username in [{}]", quoted.join(", "))
    }

    fn match_resources(&self) -> MatchResources {
        let rule = |groups: Vec<String>, resources: Vec<String>| NamedRuleWithOperations {
            api_groups: Some(groups),
            api_versions: Some(vec!["*".to_owned()]),
            operations: Some(OPERATIONS.iter().map(|o| (*o).to_owned()).collect()),
            resources: Some(resources),
            scope: Some("*".to_owned()),
            resource_names: None,
        };
        // `*/*` alone means every resource and subresource; the API server refuses it beside
        // anything else.
        let with_subresources = |r: &str| {
            if r == "*" {
                vec!["*/*".to_owned()]
            } else {
                vec![r.to_owned(), format!("{r}/*")]
            }
        };
        if self.resources.is_empty() {
            // Everything but what the election itself writes: its Lease, its Events, the
            // Election status it publishes, and the reviews a client makes about itself.
            let exclude = vec![
                rule(
                    vec!["coordination.k8s.io".to_owned()],
                    with_subresources("leases"),
                ),
                rule(vec![String::new()], with_subresources("events")),
                rule(
                    vec!["events.k8s.io".to_owned()],
                    with_subresources("events"),
                ),
                rule(
                    vec!["tenure.dev".to_owned()],
                    with_subresources("elections"),
                ),
                rule(
                    vec![
                        "authentication.k8s.io".to_owned(),
                        "authorization.k8s.io".to_owned(),
                    ],
                    with_subresources("*"),
                ),
            ];
            return MatchResources {
                resource_rules: Some(vec![rule(vec!["*".to_owned()], with_subresources("*"))]),
                exclude_resource_rules: Some(exclude),
                match_policy: Some("Equivalent".to_owned()),
                ..MatchResources::default()
            };
        }
        let mut by_group: BTreeMap<&str, Vec<String>> = BTreeMap::new();
        for r in &self.resources {
            by_group
                .entry(&r.group)
                .or_default()
                .extend(with_subresources(&r.resource));
        }
        MatchResources {
            resource_rules: Some(
                by_group
                    .into_iter()
                    .map(|(group, resources)| rule(vec![group.to_owned()], resources))
                    .collect(),
            ),
            match_policy: Some("Equivalent".to_owned()),
            ..MatchResources::default()
        }
    }
}

/// The CEL variables: who holds the Lease, the term's floor, the writer's token.
fn variables() -> Vec<Variable> {
    let holder_identity = record::HOLDER_IDENTITY;
    let floor = record::FENCING_FLOOR;
    let var = |name: &str, expression: String| Variable {
        name: name.to_owned(),
        expression,
    };
    vec![
        var(
            "lease",
            "params.metadata.namespace + '/' + params.metadata.name".to_owned(),
        ),
        var(
            "holder",
            "has(params.spec) && has(params.spec.holderIdentity) ? params.spec.holderIdentity : ''"
                .to_owned(),
        ),
        // A holder that is not tenure's: client-go and friends keep tenure's annotations but
        // overwrite holderIdentity, so the two disagree.
        var(
            "foreignHolder",
            format!(
                "variables.holder != '' && !(has(params.metadata.annotations) && \
                 '{holder_identity}' in params.metadata.annotations && \
                 params.metadata.annotations['{holder_identity}'] == variables.holder)"
            ),
        ),
        // A malformed floor makes int() fail, and the policy's failurePolicy (Fail) refuses:
        // fail closed.
        var(
            "floor",
            format!(
                "has(params.metadata.annotations) && '{floor}' in params.metadata.annotations \
                 ? int(params.metadata.annotations['{floor}']) : 0"
            ),
        ),
        var(
            "token",
            format!(
                "has(request.userInfo.extra) && '{REQUEST_TOKEN_EXTRA}' in request.userInfo.extra \
                 && size(request.userInfo.extra['{REQUEST_TOKEN_EXTRA}']) == 1 \
                 ? request.userInfo.extra['{REQUEST_TOKEN_EXTRA}'][0] : ''"
            ),
        ),
        var(
            "wellFormed",
            "variables.token.matches('^[0-9]{1,19}$')".to_owned(),
        ),
        var(
            "objectToken",
            format!(
                "oldObject != null && has(oldObject.metadata.annotations) && \
                 '{OBJECT_TOKEN_ANNOTATION}' in oldObject.metadata.annotations && \
                 oldObject.metadata.annotations['{OBJECT_TOKEN_ANNOTATION}'].matches('^[0-9]{{1,19}}$') \
                 ? int(oldObject.metadata.annotations['{OBJECT_TOKEN_ANNOTATION}']) : 0"
            ),
        ),
    ]
}

/// The check, as **one** validation (each validation is a CEL program of its own, evaluated
/// on every governed write: one costs measurably less than five), with a message the client
/// parses into a typed error ([`FenceError`](super::FenceError)): keep the wording in step
/// with `super::client::classify_status`. The message is only evaluated on a refusal.
fn validations() -> Vec<Validation> {
    let stale = |tail: &str| {
        format!(
            "'{REFUSAL_PREFIX} lease ' + variables.lease + ': stale: token ' + variables.token + {tail}"
        )
    };
    let message = format!(
        "variables.token == '' ? '{REFUSAL_PREFIX} lease ' + variables.lease + ': missing \
         token: a write from a participant of this election must carry its term fencing token \
         (the user extra {REQUEST_TOKEN_EXTRA}, sent by tenure::fence::kube::Fencer)' \
         : !variables.wellFormed ? '{REFUSAL_PREFIX} lease ' + variables.lease + ': malformed \
         token: ' + variables.token \
         : variables.foreignHolder ? {} \
         : int(variables.token) < variables.floor ? {} \
         : {}",
        stale(
            "', but the lease is held by ' + variables.holder + ', which is not a tenure replica'"
        ),
        stale("' < current ' + string(variables.floor)"),
        stale("' < object ' + string(variables.objectToken)"),
    );
    vec![Validation {
        // A tokened write: well formed, no foreign holder, not below the term's or the
        // object's token. A token-less one: only while a foreign holder (client-go) leads.
        expression: "variables.token != '' ? (variables.wellFormed && !variables.foreignHolder \
                     && int(variables.token) >= variables.floor \
                     && int(variables.token) >= variables.objectToken) \
                     : variables.foreignHolder"
            .to_owned(),
        message_expression: Some(message),
        message: None,
        reason: Some("Forbidden".to_owned()),
    }]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked_and_named_in_errors() {
        for (ns, lease, what) in [
            ("Bad", "x", "namespace"),
            ("ns", "Bad_Lease", "lease"),
            ("", "x", "namespace"),
        ] {
            let e = FencingPolicy::new(ns, lease).expect_err(lease);
            assert!(
                matches!(e, PolicyError::Invalid { what: w, .. } if w == what),
                "{e}"
            );
        }
        let p = FencingPolicy::new("ns", "x").expect("valid");
        for bad in ["Deployments", "deployments.", "a b", "", "x.Apps"] {
            let e = p.clone().resource(bad).expect_err(bad);
            assert!(e.to_string().contains("resource"), "{e}");
        }
        assert!(p.clone().service_account("ns", "A").is_err());
        assert!(p.clone().user("it's").is_err());
        let long = "a".repeat(250);
        assert!(
            FencingPolicy::new("ns", &long).is_err(),
            "policy name too long"
        );
    }

    #[test]
    fn governed_resources_group_by_api_group_with_subresources() {
        let p = FencingPolicy::new("ns", "x")
            .and_then(|p| p.resource("deployments.apps"))
            .and_then(|p| p.resource("configmaps"))
            .and_then(|p| p.resource("statefulsets.apps"))
            .and_then(|p| p.service_account("ns", "sa"))
            .expect("valid");
        let rules = p
            .policy()
            .spec
            .and_then(|s| s.match_constraints)
            .and_then(|m| m.resource_rules)
            .expect("rules");
        let flat: Vec<(Vec<String>, Vec<String>)> = rules
            .into_iter()
            .map(|r| {
                (
                    r.api_groups.unwrap_or_default(),
                    r.resources.unwrap_or_default(),
                )
            })
            .collect();
        assert_eq!(
            flat,
            vec![
                (
                    vec![String::new()],
                    vec!["configmaps".into(), "configmaps/*".into()]
                ),
                (
                    vec!["apps".into()],
                    vec![
                        "deployments".into(),
                        "deployments/*".into(),
                        "statefulsets".into(),
                        "statefulsets/*".into()
                    ]
                ),
            ]
        );
    }

    #[test]
    fn participants_are_matched_by_user_name() {
        let p = FencingPolicy::new("ns", "x")
            .and_then(|p| p.service_account("ns", "a"))
            .and_then(|p| p.user("alice@example.com"))
            .and_then(|p| p.service_account("ns", "a"))
            .expect("valid");
        let conditions = p
            .policy()
            .spec
            .and_then(|s| s.match_conditions)
            .expect("conditions");
        assert_eq!(
            conditions[0].expression,
            "request.userInfo.username in ['system:serviceaccount:ns:a', 'alice@example.com']"
        );
    }
}
