//! The ValidatingAdmissionPolicy that makes the API server refuse a stale leader's writes:
//! generated for one election from its Lease, its participants and the resources it governs.

use std::collections::BTreeMap;

use k8s_openapi::api::admissionregistration::v1::{
    MatchCondition, MatchResources, NamedRuleWithOperations, ParamKind, ParamRef,
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
    ValidatingAdmissionPolicyBindingSpec, ValidatingAdmissionPolicySpec, Validation, Variable,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};

use super::{OBJECT_TOKEN_ANNOTATION, REFUSAL_PREFIX, REQUEST_ELECTION_EXTRA, REQUEST_TOKEN_EXTRA};
use crate::backend::kube::record;

/// A write to a governed object that the policy checks. CONNECT is pods/exec, attach,
/// portforward and the proxies: the rules name every subresource (`resource/*`), so a
/// governed pod's exec is fenced like its update.
const OPERATIONS: [&str; 4] = ["CREATE", "UPDATE", "DELETE", "CONNECT"];

/// The name of the anchor policy and its binding (see [`FencingPolicy::anchor`]).
pub const ANCHOR_NAME: &str = "tenure-fencing-anchor";

/// What the election itself writes without a token: governing it would keep every replica
/// from leading (the Lease), or refuse its own Events and status.
const ELECTION_OWN: [(&str, &str, &str); 4] = [
    (
        "coordination.k8s.io",
        "leases",
        "the election's Lease is written by its candidates without a token",
    ),
    (
        "",
        "events",
        "the election writes its Events without a token",
    ),
    (
        "events.k8s.io",
        "events",
        "the election writes its Events without a token",
    ),
    (
        "tenure.dev",
        "elections",
        "the election publishes its Election status without a token",
    ),
];

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
///   then on;
/// - tokens are compared as decimal strings (form, then length, then lexically), so no value
///   of any length makes the CEL fail; a malformed floor on the Lease refuses every
///   participant write with a message naming the Lease and the annotation (fail closed);
/// - a participant's write may set the object's `tenure.dev/fencing-token` only to its own
///   request token. The policy does not compare a write with the object's annotation: a
///   value a term could have issued is at most the floor, which the write already passed,
///   and any other value (set by a person, another election, a copied manifest) must not
///   lock later terms out;
/// - each request names its election (the user extra `tenure.dev/fencing-election`,
///   `NAMESPACE/LEASE`, which [`Fencer`](super::Fencer) sends beside the token) and the policy
///   judges only the requests naming its own: a participant may take part in any number of
///   elections, each judged by its own floor (tokens are resourceVersions, ordered across all
///   Leases, so another election's floor would refuse a live term). A write carrying a token
///   but naming no election is refused;
/// - one more kind of Lease is governed: the probes `tenure-fence-probe.<lease>`
///   ([`probe`](Self::probe)), which no one creates — a term's dry-run creates of its own probe
///   prove the policy is live ([`Fencer`](super::Fencer)). Every election's policy judges every
///   probe (passing those naming another election), so a probe meets every policy a real
///   write of the participant would, and one that would refuse it is seen.
///
/// Install the [`anchor`](Self::anchor) too, and never delete it: on Kubernetes 1.30–1.36
/// an API server stops reading Lease parameters for good once no Lease-parameter policy has a
/// binding (kubernetes/kubernetes#130887), and the anchor's binding keeps one forever.
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
    /// A sharded group's shard count ([`shards`](Self::shards)): one policy for all its
    /// shard Leases.
    shards: Option<u32>,
    /// Whether the replicas announce themselves in member Leases
    /// ([`member_leases`](Self::member_leases)): only the workers' RBAC depends on it.
    member_leases: bool,
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
    /// A resource the election itself writes without a token: governing it would keep every
    /// replica from leading, or refuse the election's own Events or status.
    #[error("cannot govern {resource}: {reason}")]
    ElectionOwn {
        /// The resource as given.
        resource: String,
        /// Why the election needs it unfenced.
        reason: &'static str,
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
            shards: None,
            member_leases: false,
        })
    }

    /// Makes this the policy of the **sharded group** `lease` (`tenure run --lease LEASE
    /// --shards N`, a [`ShardedElector`](crate::shard::ShardedElector) of that name): one
    /// policy and one binding for every shard, whatever the count.
    ///
    /// The binding selects the group's shard Leases (`LEASE-0` … `LEASE-<N-1>`) by the label
    /// every shard Lease carries once tenure acquired it, `tenure.dev/shard-group=LEASE`, and
    /// the API server evaluates the policy once per selected Lease. Each evaluation judges only
    /// the requests naming its own shard's election (`NAMESPACE/LEASE-SHARD`, which a shard
    /// term's [`Fencer`](super::Fencer) clients and `tenure run --shards --fence` send), and
    /// requests that name no shard (no token, no election, or the group itself: refused);
    /// requests naming another shard or another election pass it. The shard's token must be
    /// its current term's exactly (the Lease's floor): a lower one is stale, any other is not
    /// that shard's term (a write naming a shard its replica does not hold).
    ///
    /// `shards` is the group's count: the policy and binding do not depend on it (a resize
    /// needs no new policy), [`check`](super::check) proves each of the shards `0..shards`,
    /// and [`to_yaml`](Self::to_yaml) names it.
    ///
    /// # Errors
    ///
    /// [`PolicyError::Invalid`] for a count that is 0 or above
    /// [`MAX_SHARDS`](crate::shard::MAX_SHARDS).
    pub fn shards(mut self, shards: u32) -> Result<Self, PolicyError> {
        let max = crate::shard::MAX_SHARDS;
        if shards == 0 || shards > max {
            return Err(invalid(
                "shard count",
                &shards.to_string(),
                format!("must be from 1 to {max}"),
            ));
        }
        self.shards = Some(shards);
        Ok(self)
    }

    /// Makes this the policy of an election whose replicas announce themselves in **member
    /// Leases**: with a [`Preference`](crate::election::Preference) or a
    /// [`HealthPolicy`](crate::election::HealthPolicy) (`tenure run --prefer` /
    /// `--health-cmd`), each replica keeps a Lease `LEASE-healthy-member-<hash>` that the leader
    /// reads to choose its successor. Only [`worker_rbac`](Self::worker_rbac) changes: the
    /// participants may then get, list, watch, update, patch, create and delete Leases of any
    /// name in the election's namespace (a member Lease is named after its replica's identity,
    /// unknown in advance, found by a label-selected list and written by a server-side apply).
    /// The policy and its binding are the same: it governs no Lease but the probes, so a
    /// member Lease is written without a token.
    ///
    /// A sharded group's RBAC ([`shards`](Self::shards)) already covers its member Leases.
    #[must_use]
    pub fn member_leases(mut self) -> Self {
        self.member_leases = true;
        self
    }

    /// Whether the replicas announce themselves in member Leases
    /// ([`member_leases`](Self::member_leases), or a sharded group's).
    #[must_use]
    pub fn has_member_leases(&self) -> bool {
        self.member_leases || self.shards.is_some()
    }

    /// The sharded group's shard count, if this is a group's policy
    /// ([`shards`](Self::shards)).
    #[must_use]
    pub fn shard_count(&self) -> Option<u32> {
        self.shards
    }

    /// The Lease (and election) of shard `shard` of this sharded group, `LEASE-SHARD`.
    #[must_use]
    pub fn shard_lease(&self, shard: u32) -> String {
        crate::backend::group::shard_lease_name(&self.lease, shard)
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
    /// objects and all their subresources (`status`, `scale`, `exec`, …).
    ///
    /// # Errors
    ///
    /// [`PolicyError::Invalid`] when the resource part is not a DNS-1123 label or the group
    /// part not a DNS-1123 subdomain; [`PolicyError::ElectionOwn`] for
    /// `leases.coordination.k8s.io`, `events`, `events.events.k8s.io` and
    /// `elections.tenure.dev`, which the election writes without a token.
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
        if let Some((_, _, reason)) = ELECTION_OWN
            .iter()
            .find(|(g, r, _)| *g == group && *r == name)
        {
            return Err(PolicyError::ElectionOwn {
                resource: resource.to_owned(),
                reason,
            });
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

    /// The election Lease's namespace.
    #[must_use]
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// The participants, as the API server authenticates them
    /// (`system:serviceaccount:NS:NAME` for a ServiceAccount).
    #[must_use]
    pub fn participants(&self) -> &[String] {
        &self.users
    }

    /// The election Lease's name.
    #[must_use]
    pub fn lease_name(&self) -> &str {
        &self.lease
    }

    /// The name of the probe Lease, `tenure-fence-probe.<lease>` in the election's namespace:
    /// the one Lease the policy governs. Nobody creates it; a term's proof sends dry-run
    /// creates of it ([`Fencer`](super::Fencer)), which the API server judges like any
    /// governed write and stores nothing.
    #[must_use]
    pub fn probe(&self) -> String {
        probe_name(&self.lease)
    }

    /// The policy's and binding's metadata: their name and [`labels`](Self::labels).
    fn metadata(&self) -> ObjectMeta {
        ObjectMeta {
            name: Some(self.name()),
            labels: Some(self.labels()),
            ..ObjectMeta::default()
        }
    }

    /// The labels of every object generated for this election (the policy, its binding and
    /// the workers' RBAC): `app.kubernetes.io/managed-by: tenure` and the election's Lease,
    /// so `kubectl get -l tenure.dev/lease=LEASE` finds them all.
    pub(super) fn labels(&self) -> BTreeMap<String, String> {
        BTreeMap::from([
            (
                "app.kubernetes.io/managed-by".to_owned(),
                "tenure".to_owned(),
            ),
            ("tenure.dev/lease".to_owned(), self.lease.clone()),
            (
                "tenure.dev/lease-namespace".to_owned(),
                self.namespace.clone(),
            ),
        ])
    }

    /// The `ValidatingAdmissionPolicy` (admissionregistration.k8s.io/v1). A sharded group's
    /// ([`shards`](Self::shards)) differs only in its CEL, the same for every group.
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
                match_conditions: Some(vec![
                    MatchCondition {
                        name: "election-participant".to_owned(),
                        expression: self.participant_expression(),
                    },
                    MatchCondition {
                        name: "not-a-lease-but-a-probe".to_owned(),
                        expression: self.probe_expression(),
                    },
                ]),
                variables: Some(variables(self.shards.is_some())),
                validations: Some(if self.shards.is_some() {
                    shard_validations()
                } else {
                    validations()
                }),
                ..ValidatingAdmissionPolicySpec::default()
            }),
            status: None,
        }
    }

    /// The `ValidatingAdmissionPolicyBinding` that applies the policy with the election's
    /// Lease as its parameter. While the Lease is missing nothing is fenced (see the type's
    /// docs): install [`lease`](Self::lease) with it.
    ///
    /// A sharded group's binding ([`shards`](Self::shards)) selects the group's shard Leases
    /// by their label `tenure.dev/shard-group` instead: while none exists (before the group's
    /// first grant) nothing is fenced, and a shard Lease is created, labelled, by its first
    /// grant.
    #[must_use]
    pub fn binding(&self) -> ValidatingAdmissionPolicyBinding {
        let (name, selector) = if self.shards.is_some() {
            (None, Some(self.shard_selector()))
        } else {
            (Some(self.lease.clone()), None)
        };
        ValidatingAdmissionPolicyBinding {
            metadata: self.metadata(),
            spec: ValidatingAdmissionPolicyBindingSpec {
                policy_name: self.name(),
                param_ref: Some(ParamRef {
                    name,
                    namespace: Some(self.namespace.clone()),
                    // Not Deny: the parameter is resolved before matchConditions, so a
                    // missing Lease would refuse every writer (see the module docs).
                    parameter_not_found_action: Some("Allow".to_owned()),
                    selector,
                }),
                validation_actions: vec!["Deny".to_owned()],
                match_resources: None,
            },
        }
    }

    /// The label selector of a sharded group's shard Leases: `tenure.dev/shard-group=LEASE`
    /// (the label the Kubernetes backend writes with every shard grant).
    fn shard_selector(&self) -> LabelSelector {
        LabelSelector {
            match_labels: Some(BTreeMap::from([(
                crate::backend::kube::SHARD_GROUP_LABEL.to_owned(),
                crate::backend::kube::group_label_value(&self.lease),
            )])),
            match_expressions: None,
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

    /// The anchor ([`anchor`](Self::anchor)), the Lease, the policy and the binding as one
    /// YAML stream, ready for `kubectl apply -f -` (what `tenure policy` prints). A sharded
    /// group's has no Lease: each shard Lease is created, labelled, by its first grant.
    ///
    /// Needs the `crd` feature (its YAML writer), besides `kube`.
    #[cfg(feature = "crd")]
    #[must_use]
    pub fn to_yaml(&self) -> String {
        const ADMISSION: &str = "admissionregistration.k8s.io/v1";
        let (anchor, anchor_binding) = Self::anchor();
        let (what, lease) = match self.shards {
            Some(n) => (
                format!(
                    "sharded group {}/{} ({n} shards: Leases {}-0 to {}-{}, and those of any count)",
                    self.namespace,
                    self.lease,
                    self.lease,
                    self.lease,
                    n - 1
                ),
                format!(
                    "# No Lease: the binding selects the shard Leases by their label {}, written by\n\
                     # each shard's first grant.\n",
                    crate::backend::kube::SHARD_GROUP_LABEL
                ),
            ),
            None => (
                format!("lease {}/{}", self.namespace, self.lease),
                format!(
                    "# The Lease before its policy: the policy reads it as its parameter.\n{}---\n",
                    to_yaml_doc(&self.lease(), "coordination.k8s.io/v1", "Lease")
                ),
            ),
        };
        format!(
            "# tenure fencing policy for {what}: generated by `tenure policy`; do not edit.\n\
             # First the anchor, shared by every election: never delete it (kubernetes#130887:\n\
             # without a Lease-parameter binding, API servers stop reading Leases until restarted).\n\
             {}---\n{}---\n{lease}{}---\n{}",
            to_yaml_doc(&anchor, ADMISSION, "ValidatingAdmissionPolicy"),
            to_yaml_doc(
                &anchor_binding,
                ADMISSION,
                "ValidatingAdmissionPolicyBinding"
            ),
            to_yaml_doc(&self.policy(), ADMISSION, "ValidatingAdmissionPolicy"),
            to_yaml_doc(
                &self.binding(),
                ADMISSION,
                "ValidatingAdmissionPolicyBinding"
            ),
        )
    }

    fn participant_expression(&self) -> String {
        let quoted: Vec<String> = self.users.iter().map(|u| format!("'{u}'")).collect();
        format!("request.userInfo.username in [{}]", quoted.join(", "))
    }

    /// Leases are the election's own (its Lease, shard and member Leases), written without a
    /// token; the governed Leases are the probes — every election's, not only this one's, so
    /// that a probe goes through every policy a real write of its participant would (each
    /// passes a probe naming another election; one that refuses it is seen by the proof).
    /// (A condition, not an exclusion rule: exclusions cannot spare one name.)
    fn probe_expression(&self) -> String {
        format!(
            "!(request.resource.group == 'coordination.k8s.io' && request.resource.resource == 'leases') || request.name.startsWith('{PROBE_PREFIX}')"
        )
    }

    /// The anchor: a ValidatingAdmissionPolicy with paramKind Lease and a binding that
    /// matches nothing (a resource no API serves), named [`ANCHOR_NAME`]. Install it before
    /// any election's policy and never delete it.
    ///
    /// Why: on Kubernetes 1.30–1.36 each API server stops its Lease parameter informer for
    /// good the moment no policy with paramKind Lease has a binding (deleting the last
    /// election's binding is enough; kubernetes/kubernetes#130887, #133827, fix #141015), and
    /// from then on every fencing policy reads a frozen Lease or none and admits stale writes
    /// until that API server restarts. The anchor's binding keeps the kind in use forever.
    /// It costs nothing at admission: it matches no request. One per cluster is enough:
    /// `tenure policy` and the Helm chart both install this one (the chart's releases leave it
    /// to the first of them that installed it).
    #[must_use]
    pub fn anchor() -> (ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding) {
        anchor_named(ANCHOR_NAME)
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
            // Everything but what the election itself writes: its Events, the Election status
            // it publishes, and the reviews a client makes about itself. Leases match here and
            // are spared by `probe_expression` (all but the probe).
            let exclude = vec![
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
        // The probe: Leases, of which `probe_expression` lets only the probe through.
        let probe = NamedRuleWithOperations {
            operations: Some(vec!["CREATE".to_owned()]),
            ..rule(
                vec!["coordination.k8s.io".to_owned()],
                vec!["leases".to_owned()],
            )
        };
        MatchResources {
            resource_rules: Some(
                by_group
                    .into_iter()
                    .map(|(group, resources)| rule(vec![group.to_owned()], resources))
                    .chain(std::iter::once(probe))
                    .collect(),
            ),
            match_policy: Some("Equivalent".to_owned()),
            ..MatchResources::default()
        }
    }
}

/// How every probe Lease's name begins.
const PROBE_PREFIX: &str = "tenure-fence-probe.";

/// The probe Lease of the election whose Lease is `lease` (see [`FencingPolicy::probe`]).
pub(crate) fn probe_name(lease: &str) -> String {
    format!("{PROBE_PREFIX}{lease}")
}

/// The anchor policy and binding under `name`.
fn anchor_named(name: &str) -> (ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding) {
    let metadata = ObjectMeta {
        name: Some(name.to_owned()),
        labels: Some(BTreeMap::from([(
            "app.kubernetes.io/managed-by".to_owned(),
            "tenure".to_owned(),
        )])),
        annotations: Some(BTreeMap::from([(
            "tenure.dev/why".to_owned(),
            "keeps the API server's Lease parameter informer running (kubernetes/kubernetes#130887); \
             never delete it"
                .to_owned(),
        )])),
        ..ObjectMeta::default()
    };
    let policy = ValidatingAdmissionPolicy {
        metadata: metadata.clone(),
        spec: Some(ValidatingAdmissionPolicySpec {
            failure_policy: Some("Ignore".to_owned()),
            param_kind: Some(ParamKind {
                api_version: Some("coordination.k8s.io/v1".to_owned()),
                kind: Some("Lease".to_owned()),
            }),
            // A resource no API server serves: the policy never matches a request.
            match_constraints: Some(MatchResources {
                resource_rules: Some(vec![NamedRuleWithOperations {
                    api_groups: Some(vec!["tenure.dev".to_owned()]),
                    api_versions: Some(vec!["v1".to_owned()]),
                    operations: Some(vec!["CREATE".to_owned()]),
                    resources: Some(vec!["fencinganchors".to_owned()]),
                    scope: Some("*".to_owned()),
                    resource_names: None,
                }]),
                ..MatchResources::default()
            }),
            validations: Some(vec![Validation {
                expression: "true".to_owned(),
                ..Validation::default()
            }]),
            ..ValidatingAdmissionPolicySpec::default()
        }),
        status: None,
    };
    let binding = ValidatingAdmissionPolicyBinding {
        metadata,
        spec: ValidatingAdmissionPolicyBindingSpec {
            policy_name: name.to_owned(),
            param_ref: Some(ParamRef {
                name: Some(name.to_owned()),
                namespace: None,
                parameter_not_found_action: Some("Allow".to_owned()),
                selector: None,
            }),
            validation_actions: vec!["Deny".to_owned()],
            match_resources: None,
        },
    };
    (policy, binding)
}

/// A CEL expression true when the string `s` is a fencing token in canonical form: decimal,
/// no sign, no leading zero, a u64 (at most 20 digits, and of 20 digits at most u64::MAX,
/// compared as strings: same length, so lexical order is numeric). The size test comes first
/// so a huge value costs nothing more. A 20-digit floor above u64::MAX is broken here as it
/// is to `tenure policy --check` (`check::parse_floor`), which reads floors as u64.
fn canonical(s: &str) -> String {
    format!(
        "(size({s}) <= 20 && {s}.matches('^(0|[1-9][0-9]*)$') && (size({s}) < 20 || \
         {s} <= '{}'))",
        u64::MAX
    )
}

/// The CEL variables: who holds the Lease, the term's floor, the writer's token, and the
/// object token the write sets. Tokens stay strings: `int()` fails on 20 digits (and any
/// failure refuses everyone under `failurePolicy: Fail`), so they are compared by form,
/// then length, then lexically — for canonical decimals that is numeric order.
///
/// A sharded group's (`sharded`) are the same but three: which requests an evaluation (one
/// per shard Lease) leaves to another (`otherElection`), what is current (the shard's term's
/// token exactly, not at least it), and the group and shard its messages name. They read the
/// group from the parameter's name, never from the policy's inputs, so one CEL serves every
/// group (the chart includes it verbatim).
fn variables(sharded: bool) -> Vec<Variable> {
    let holder_identity = record::HOLDER_IDENTITY;
    let floor = record::FENCING_FLOOR;
    let var = |name: &str, expression: String| Variable {
        name: name.to_owned(),
        expression,
    };
    let annotation = |object: &str, key: &str| {
        format!(
            "{object} != null && has({object}.metadata) && has({object}.metadata.annotations) && \
             '{key}' in {object}.metadata.annotations ? {object}.metadata.annotations['{key}'] : ''"
        )
    };
    let mut variables = vec![
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
        // No floor yet (no term was granted): every token passes it.
        var(
            "floor",
            format!(
                "has(params.metadata.annotations) && '{floor}' in params.metadata.annotations \
                 ? params.metadata.annotations['{floor}'] : '0'"
            ),
        ),
        var("floorOk", canonical("variables.floor")),
        var(
            "token",
            format!(
                "has(request.userInfo.extra) && '{REQUEST_TOKEN_EXTRA}' in request.userInfo.extra \
                 && size(request.userInfo.extra['{REQUEST_TOKEN_EXTRA}']) == 1 \
                 ? request.userInfo.extra['{REQUEST_TOKEN_EXTRA}'][0] : ''"
            ),
        ),
        var("tokenOk", canonical("variables.token")),
        // The election the request names (`NAMESPACE/LEASE`): a participant of several
        // elections sends each election's token with its name, and each policy judges only
        // the requests naming it — tokens are resourceVersions, ordered across every Lease,
        // so judged by another election's floor a live term's token would be refused.
        var(
            "election",
            format!(
                "has(request.userInfo.extra) && '{REQUEST_ELECTION_EXTRA}' in \
                 request.userInfo.extra && size(request.userInfo.extra['{REQUEST_ELECTION_EXTRA}']) \
                 == 1 ? request.userInfo.extra['{REQUEST_ELECTION_EXTRA}'][0] : ''"
            ),
        ),
        if sharded {
            // Another election, or another shard of this group (its own evaluation judges
            // it): neither this shard's election nor the group itself, `NS/GROUP`, which
            // names no shard (this Lease is `NS/GROUP-SHARD`). Each shard Lease is an
            // evaluation of its own, so the common case — a request naming another shard —
            // costs two string comparisons here.
            var(
                "otherElection",
                "variables.election != '' && variables.election != variables.lease && \
                 !variables.lease.startsWith(variables.election + '-')"
                    .to_owned(),
            )
        } else {
            var(
                "otherElection",
                "variables.election != '' && variables.election != variables.lease".to_owned(),
            )
        },
        if sharded {
            // The shard's term's own token: every grant's token is a resourceVersion, unique
            // across the cluster, so a token of another shard's term (a replica writing for a
            // shard it does not hold) never equals this shard's floor.
            var("current", "variables.token == variables.floor".to_owned())
        } else {
            // token >= floor, both canonical.
            var(
                "current",
                "size(variables.token) > size(variables.floor) || (size(variables.token) == \
                 size(variables.floor) && variables.token >= variables.floor)"
                    .to_owned(),
            )
        },
        // The object token the write leaves: a participant may set it only to its own token
        // (or keep what was there, or leave it out). Empty for deletes and CONNECT.
        var("stamp", annotation("object", OBJECT_TOKEN_ANNOTATION)),
        var(
            "stampOk",
            format!(
                "variables.stamp == '' || variables.stamp == variables.token || \
                 variables.stamp == ({})",
                annotation("oldObject", OBJECT_TOKEN_ANNOTATION)
            ),
        ),
    ];
    if sharded {
        // For messages only (read only by the evaluation of the shard a write names, see
        // `SPARED`): `NS/GROUP` and `SHARD` of this shard Lease `NS/GROUP-SHARD`. A Lease
        // someone else labelled, without a '-', names itself.
        let cut = "variables.lease.lastIndexOf('-')";
        variables.push(var(
            "group",
            format!("{cut} > 0 ? variables.lease.substring(0, {cut}) : variables.lease"),
        ));
        variables.push(var(
            "shard",
            format!("{cut} > 0 ? variables.lease.substring({cut} + 1) : ''"),
        ));
    }
    variables
}

/// The head of every `messageExpression`: a write naming another election (or, in a group,
/// another shard) gets the empty message without a string built. The API server evaluates the
/// messages of every evaluation whether the write passes or not (k8s.io/apiserver
/// `validator.go` runs the message filter before it looks at the verdicts), and a group's
/// policy is evaluated once per shard Lease, so without this each write naming one shard of
/// N built N - 1 refusal messages nobody reads. An empty message is never shown: the
/// validation passes whenever `otherElection` holds.
const SPARED: &str = "variables.otherElection ? '' : ";

/// The check, as **one** validation (each validation is a CEL program of its own, evaluated
/// on every governed write: one costs measurably less than five), with a message the client
/// parses into a typed error ([`FenceError`](super::FenceError)): keep the wording in step
/// with `super::client::classify_status`. The message is evaluated for every write the
/// policy matches, passing or not (see [`SPARED`]).
fn validations() -> Vec<Validation> {
    let floor = record::FENCING_FLOOR;
    let head = format!("'{REFUSAL_PREFIX} lease ' + variables.lease + ': ");
    // A value from the request or the Lease shown in a message: at most 40 characters.
    let shown = |v: &str| format!("(size({v}) > 40 ? {v}.substring(0, 40) + '...' : {v})");
    let message = format!(
        "{SPARED}variables.token == '' ? {head}missing token: a write from a participant of this \
         election must carry its term\\'s fencing token (the user extra {REQUEST_TOKEN_EXTRA}, \
         sent for a command by tenure run --fence (write through its KUBECONFIG), by \
         tenure::fence::kube::Fencer, or as the headers Impersonate-User and \
         Impersonate-Extra-tenure.dev%2Ffencing-token)' \
         : variables.election == '' ? {head}missing election: a write carrying a fencing \
         token must name its election (the user extra {REQUEST_ELECTION_EXTRA}, NAMESPACE/LEASE, \
         sent by tenure run --fence and by tenure::fence::kube::Fencer; a client of an older \
         tenure sends none)' \
         : !variables.tokenOk ? {head}malformed token: ' + {token} + ' (a fencing token is a \
         decimal number without sign or leading zeros)' \
         : !variables.floorOk ? {head}broken floor: the Lease\\'s annotation {floor} is \"' + \
         {floor_shown} + '\", not a fencing token; participant writes are refused until the \
         next grant rewrites it (or remove the annotation)' \
         : variables.foreignHolder ? {head}stale: token ' + variables.token + ', but the lease \
         is held by ' + variables.holder + ', which is not a tenure replica' \
         : !variables.current ? {head}stale: token ' + variables.token + ' < current ' + \
         variables.floor \
         : {head}object token: this write sets {OBJECT_TOKEN_ANNOTATION} to \"' + {stamp} + \
         '\"; a participant may set it only to its own token ' + variables.token",
        token = shown("variables.token"),
        floor_shown = shown("variables.floor"),
        stamp = shown("variables.stamp"),
    );
    vec![Validation {
        // A write naming another election: that election's policy judges it. A tokened
        // write: naming this election, well formed, a well-formed floor, no foreign holder,
        // not below the term's token, and no foreign object token set. A token-less one:
        // only while a foreign holder (client-go) leads.
        expression: "variables.otherElection || (variables.token != '' ? \
                     (variables.election != '' && variables.tokenOk && variables.floorOk && \
                     !variables.foreignHolder && variables.current && variables.stampOk) \
                     : variables.foreignHolder)"
            .to_owned(),
        message_expression: Some(message),
        message: None,
        reason: Some("Forbidden".to_owned()),
    }]
}

/// A sharded group's check ([`FencingPolicy::shards`]), as one validation evaluated once per
/// shard Lease: a request naming another election or another shard passes (that one's
/// evaluation judges it); one naming this shard must carry exactly its current term's token
/// (below it: stale; any other: not this shard's term); one naming no shard — no token, no
/// election, or the group itself — is refused, by every evaluation alike. Refusals name the
/// group, the shard, the token and the current one; the wording of what they share with
/// [`validations`] is the same (`super::error::classify_status` and the proof parse both).
fn shard_validations() -> Vec<Validation> {
    let floor = record::FENCING_FLOOR;
    let lease_head = format!("'{REFUSAL_PREFIX} lease ' + variables.lease + ': ");
    let group_head = format!("'{REFUSAL_PREFIX} group ' + variables.group + ': ");
    let shown = |v: &str| format!("(size({v}) > 40 ? {v}.substring(0, 40) + '...' : {v})");
    let which = "' (shard ' + variables.shard + ' of group ' + variables.group + ')'";
    let message = format!(
        "{SPARED}variables.token == '' ? {group_head}missing token: a write from a participant of this \
         sharded group must carry its shard term\\'s fencing token (the user extra \
         {REQUEST_TOKEN_EXTRA}, sent for a command by tenure run --shards --fence (write \
         through its KUBECONFIG), by tenure::fence::kube::Fencer, or as the headers \
         Impersonate-User and Impersonate-Extra-tenure.dev%2Ffencing-token)' \
         : variables.election == '' ? {group_head}missing election: a write carrying a fencing \
         token must name its shard\\'s election (the user extra {REQUEST_ELECTION_EXTRA}, \
         NAMESPACE/GROUP-SHARD, sent by tenure run --shards --fence and by \
         tenure::fence::kube::Fencer; a client of an older tenure sends none)' \
         : variables.election != variables.lease ? {group_head}missing shard: the write names \
         the group ' + {election} + ' itself; a fenced write of a sharded group names its shard\\'s \
         election, NAMESPACE/GROUP-SHARD (a Fencer client of the shard\\'s Term, or tenure run \
         --shards --fence, sends it)' \
         : !variables.tokenOk ? {lease_head}malformed token: ' + {token} + ' (a fencing token is \
         a decimal number without sign or leading zeros)' + {which} \
         : !variables.floorOk ? {lease_head}broken floor: the Lease\\'s annotation {floor} is \"' + \
         {floor_shown} + '\", not a fencing token; writes naming this shard are refused until its \
         next grant rewrites it (or remove the annotation)' + {which} \
         : variables.foreignHolder ? {lease_head}stale: token ' + variables.token + ', but the \
         lease is held by ' + variables.holder + ', which is not a tenure replica' + {which} \
         : size(variables.token) < size(variables.floor) || (size(variables.token) == \
         size(variables.floor) && variables.token < variables.floor) ? {lease_head}stale: token ' \
         + variables.token + ' < current ' + variables.floor + {which} \
         : !variables.current ? {lease_head}not this shard\\'s term: token ' + variables.token + \
         ', current ' + variables.floor + {which} + ': no term of this shard has that token \
         (a write naming a shard its replica does not hold, or to an API server that has not \
         seen the grant yet)' \
         : {lease_head}object token: this write sets {OBJECT_TOKEN_ANNOTATION} to \"' + {stamp} + \
         '\"; a participant may set it only to its own token ' + variables.token + {which}",
        token = shown("variables.token"),
        floor_shown = shown("variables.floor"),
        stamp = shown("variables.stamp"),
        election = shown("variables.election"),
    );
    vec![Validation {
        // A request naming another election or shard: its own evaluation judges it. One
        // naming this shard: its current term's token, well formed, a well-formed floor, no
        // foreign holder, no foreign object token set. One naming no shard: refused.
        expression: "variables.otherElection || (variables.token != '' && \
                     variables.election == variables.lease && variables.tokenOk && \
                     variables.floorOk && !variables.foreignHolder && variables.current && \
                     variables.stampOk)"
            .to_owned(),
        message_expression: Some(message),
        message: None,
        reason: Some("Forbidden".to_owned()),
    }]
}

/// One object as a YAML document for kubectl: k8s-openapi's types serialize without
/// `apiVersion` and `kind`, so they are added.
pub(super) fn to_yaml_doc<T: serde::Serialize>(
    object: &T,
    api_version: &str,
    kind: &str,
) -> String {
    let mut value = serde_json::to_value(object).unwrap_or_default();
    if let Some(map) = value.as_object_mut() {
        map.insert("apiVersion".into(), api_version.into());
        map.insert("kind".into(), kind.into());
    }
    // Unreachable in practice (plain data); JSON is valid YAML.
    serde_saphyr::to_string(&value)
        .or_else(|_| serde_json::to_string_pretty(&value))
        .unwrap_or_default()
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
                // The probes (only their names pass the second match condition).
                (vec!["coordination.k8s.io".into()], vec!["leases".into()]),
            ]
        );
    }

    #[test]
    fn the_elections_own_resources_cannot_be_governed() {
        let p = FencingPolicy::new("ns", "x").expect("valid");
        for own in [
            "leases.coordination.k8s.io",
            "events",
            "events.events.k8s.io",
            "elections.tenure.dev",
        ] {
            let e = p.clone().resource(own).expect_err(own);
            assert!(
                matches!(&e, PolicyError::ElectionOwn { resource, .. } if resource == own),
                "{e}"
            );
            assert!(e.to_string().contains("without a token"), "{e}");
        }
        // Names alike but not the election's are fine.
        for other in ["leases", "events.example.com", "elections.example.com"] {
            assert!(p.clone().resource(other).is_ok(), "{other}");
        }
    }

    #[test]
    fn every_operation_including_connect_is_governed() {
        let p = FencingPolicy::new("ns", "x")
            .and_then(|p| p.service_account("ns", "a"))
            .expect("valid");
        let rules = p
            .policy()
            .spec
            .and_then(|s| s.match_constraints)
            .and_then(|m| m.resource_rules)
            .expect("rules");
        assert_eq!(
            rules[0].operations.as_deref(),
            Some(
                &[
                    "CREATE".into(),
                    "UPDATE".into(),
                    "DELETE".into(),
                    "CONNECT".into()
                ][..]
            )
        );
        assert_eq!(rules[0].resources.as_deref(), Some(&["*/*".into()][..]));
    }

    #[test]
    fn leases_are_spared_but_the_probes() {
        let p = FencingPolicy::new("ns", "ctl").expect("valid");
        assert_eq!(p.probe(), "tenure-fence-probe.ctl");
        let conditions = p
            .policy()
            .spec
            .and_then(|s| s.match_conditions)
            .expect("conditions");
        assert!(
            conditions[1]
                .expression
                .ends_with("|| request.name.startsWith('tenure-fence-probe.')"),
            "{}",
            conditions[1].expression
        );
        let exclude = p
            .policy()
            .spec
            .and_then(|s| s.match_constraints)
            .and_then(|m| m.exclude_resource_rules)
            .expect("exclusions");
        assert!(
            exclude
                .iter()
                .all(|r| r.resources.as_deref() != Some(&["leases".into(), "leases/*".into()][..])),
            "Leases are not excluded by rule (the probe must match)"
        );
    }

    #[test]
    fn the_anchor_has_a_lease_param_and_matches_nothing_real() {
        let (policy, binding) = FencingPolicy::anchor();
        assert_eq!(policy.metadata.name.as_deref(), Some(ANCHOR_NAME));
        let spec = policy.spec.expect("spec");
        let kind = spec.param_kind.expect("paramKind");
        assert_eq!(kind.api_version.as_deref(), Some("coordination.k8s.io/v1"));
        assert_eq!(kind.kind.as_deref(), Some("Lease"));
        let rules = spec
            .match_constraints
            .and_then(|m| m.resource_rules)
            .expect("rules");
        assert_eq!(
            rules[0].resources.as_deref(),
            Some(&["fencinganchors".into()][..])
        );
        assert_eq!(binding.spec.policy_name, ANCHOR_NAME);
        assert!(
            binding.spec.param_ref.is_some(),
            "a binding of a param policy"
        );
    }

    fn sharded() -> FencingPolicy {
        FencingPolicy::new("ops", "orders")
            .and_then(|p| p.service_account("ops", "w"))
            .and_then(|p| p.shards(16))
            .expect("valid")
    }

    /// The CEL variable `name` of `policy`.
    fn variable(policy: &FencingPolicy, name: &str) -> String {
        policy
            .policy()
            .spec
            .and_then(|s| s.variables)
            .and_then(|v| v.into_iter().find(|v| v.name == name))
            .map(|v| v.expression)
            .unwrap_or_else(|| panic!("no variable {name}"))
    }

    #[test]
    fn a_sharded_groups_binding_selects_its_shard_leases_by_label() {
        let p = sharded();
        assert_eq!(p.shard_count(), Some(16));
        assert_eq!(p.shard_lease(3), "orders-3");
        assert_eq!(p.name(), "tenure-fencing.ops.orders");
        let param = p.binding().spec.param_ref.expect("paramRef");
        assert_eq!(param.name, None, "a selector, not one Lease");
        assert_eq!(param.namespace.as_deref(), Some("ops"));
        assert_eq!(param.parameter_not_found_action.as_deref(), Some("Allow"));
        let labels = param
            .selector
            .and_then(|s| s.match_labels)
            .expect("matchLabels");
        assert_eq!(
            labels,
            BTreeMap::from([("tenure.dev/shard-group".to_owned(), "orders".to_owned())])
        );
        // The label is the one the backend writes on every shard Lease.
        assert_eq!(
            labels
                .get(crate::backend::kube::SHARD_GROUP_LABEL)
                .map(String::as_str),
            Some(crate::backend::kube::group_label_value("orders").as_str())
        );
        // A plain election's binding names its Lease.
        let plain = FencingPolicy::new("ops", "orders")
            .expect("valid")
            .binding();
        let param = plain.spec.param_ref.expect("paramRef");
        assert_eq!(param.name.as_deref(), Some("orders"));
        assert!(param.selector.is_none());
        for bad in [0, crate::shard::MAX_SHARDS + 1] {
            let e = FencingPolicy::new("ops", "orders")
                .and_then(|p| p.shards(bad))
                .expect_err("bad count");
            assert!(
                matches!(
                    &e,
                    PolicyError::Invalid {
                        what: "shard count",
                        ..
                    }
                ),
                "{e}"
            );
        }
        assert!(
            FencingPolicy::new("ops", "orders")
                .and_then(|p| p.shards(crate::shard::MAX_SHARDS))
                .is_ok()
        );
    }

    #[test]
    fn a_sharded_groups_cel_judges_its_own_shard_exactly_and_refuses_no_shard() {
        let p = sharded();
        let plain = FencingPolicy::new("ops", "orders")
            .and_then(|p| p.service_account("ops", "w"))
            .expect("valid");
        // The same match conditions and resources: only the CEL differs.
        let spec = p.policy().spec.expect("spec");
        let plain_spec = plain.policy().spec.expect("spec");
        assert_eq!(spec.match_conditions, plain_spec.match_conditions);
        assert_eq!(spec.match_constraints, plain_spec.match_constraints);
        assert_eq!(spec.param_kind, plain_spec.param_kind);
        // Another shard of the group passes an evaluation; the group itself does not.
        assert_eq!(
            variable(&p, "otherElection"),
            "variables.election != '' && variables.election != variables.lease && \
             !variables.lease.startsWith(variables.election + '-')"
        );
        assert_eq!(
            variable(&plain, "otherElection"),
            "variables.election != '' && variables.election != variables.lease"
        );
        // Exactly the shard's term's token; a plain election's at least.
        assert_eq!(
            variable(&p, "current"),
            "variables.token == variables.floor"
        );
        assert!(variable(&plain, "current").contains(">="));
        // The group and shard for messages, from the parameter's name.
        assert_eq!(
            variable(&p, "group"),
            "variables.lease.lastIndexOf('-') > 0 ? variables.lease.substring(0, \
             variables.lease.lastIndexOf('-')) : variables.lease"
        );
        assert_eq!(
            variable(&p, "shard"),
            "variables.lease.lastIndexOf('-') > 0 ? \
             variables.lease.substring(variables.lease.lastIndexOf('-') + 1) : ''"
        );
        let validation = &spec.validations.expect("validations")[0];
        assert_eq!(
            validation.expression,
            "variables.otherElection || (variables.token != '' && variables.election == \
             variables.lease && variables.tokenOk && variables.floorOk && \
             !variables.foreignHolder && variables.current && variables.stampOk)"
        );
        let message = validation.message_expression.as_deref().expect("message");
        for says in [
            "'tenure fencing: group ' + variables.group + ': missing token:",
            "'tenure fencing: group ' + variables.group + ': missing election:",
            "variables.election != variables.lease ? 'tenure fencing: group ' + variables.group + ': missing shard:",
            "? 'tenure fencing: lease ' + variables.lease + ': stale: token ' + variables.token + ' < current ' + variables.floor + ' (shard ' + variables.shard + ' of group ' + variables.group + ')'",
            ": !variables.current ? 'tenure fencing: lease ' + variables.lease + ': not this shard\\'s term: token ' + variables.token + ', current ' + variables.floor + ' (shard ",
        ] {
            assert!(message.contains(says), "{says}\nnot in\n{message}");
        }
        assert!(
            message.contains(&super::super::proof::NOT_THIS_SHARDS_TERM.replace('\'', "\\'")),
            "the proof's marker is the policy's wording"
        );
        // Every part of a sharded group's policy but its CEL and binding is a plain election's.
        assert_eq!(p.policy().metadata, plain.policy().metadata);
    }

    /// The API server evaluates every evaluation's message, passing or not, and a group's
    /// policy once per shard Lease: a write naming another election or shard builds none.
    #[test]
    fn a_write_naming_another_election_builds_no_message() {
        for p in [
            FencingPolicy::new("apps", "orders").expect("valid"),
            sharded(),
        ] {
            let spec = p.policy().spec.expect("spec");
            let validations = spec.validations.expect("validations");
            assert_eq!(validations.len(), 1, "one CEL program per evaluation");
            for v in validations {
                let message = v.message_expression.expect("message");
                assert!(
                    message.starts_with("variables.otherElection ? '' : variables.token == '' ?"),
                    "{message}"
                );
                // And only such a write: the verdict passes it without reading the message.
                assert!(v.expression.starts_with("variables.otherElection || ("));
            }
        }
    }

    /// A token or floor is a u64, as `tenure policy --check` reads it: 20 digits above
    /// u64::MAX are not canonical.
    #[test]
    fn a_canonical_token_is_at_most_u64_max() {
        let p = sharded();
        for (name, v) in [
            ("floorOk", "variables.floor"),
            ("tokenOk", "variables.token"),
        ] {
            assert_eq!(
                variable(&p, name),
                format!(
                    "(size({v}) <= 20 && {v}.matches('^(0|[1-9][0-9]*)$') && (size({v}) < 20 || \
                     {v} <= '18446744073709551615'))"
                )
            );
        }
    }

    #[cfg(feature = "crd")]
    #[test]
    fn a_sharded_groups_yaml_has_no_lease_and_names_its_count() {
        let yaml = sharded().to_yaml();
        assert!(
            yaml.starts_with("# tenure fencing policy for sharded group ops/orders (16 shards: Leases orders-0 to orders-15"),
            "{yaml}"
        );
        assert!(!yaml.contains("\nkind: Lease\n"), "{yaml}");
        assert_eq!(
            yaml.matches("\nkind: ValidatingAdmissionPolicy\n").count(),
            2,
            "{yaml}"
        );
        assert!(yaml.contains("tenure.dev/shard-group: orders"), "{yaml}");
        let plain = FencingPolicy::new("ops", "orders")
            .expect("valid")
            .to_yaml();
        assert!(plain.contains("\nkind: Lease\n"), "{plain}");
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
