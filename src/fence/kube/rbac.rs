//! The RBAC a participant of a fenced election needs to run as a worker (`tenure run`, with
//! `--fence` or a [`Fencer`](super::Fencer)): its election Lease, Events, and impersonating
//! itself with the token's user extra — generated from the same [`FencingPolicy`] that
//! names the participants, so `tenure policy` prints one consistent set.

use std::collections::BTreeMap;

use k8s_openapi::api::rbac::v1::{
    ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding, RoleRef, Subject,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::policy::FencingPolicy;
use super::{REQUEST_ELECTION_EXTRA, REQUEST_TOKEN_EXTRA};

/// What [`FencingPolicy::worker_rbac`] gives: Roles (with their bindings) in the Lease's
/// namespace and in each participant ServiceAccount's, and the token-extra ClusterRole with
/// its binding — every object the election's own, named after it (a Helm release that
/// renders them owns them; a shared object would be deleted with whichever release owned it).
#[derive(Clone, Debug, Default)]
#[non_exhaustive]
pub struct WorkerRbac {
    /// Per namespace: the Lease rules (in the Lease's namespace) and `impersonate` on the
    /// participant ServiceAccounts of that namespace, by name.
    pub roles: Vec<(Role, RoleBinding)>,
    /// The ClusterRole granting `impersonate` on the token's and the election's user extras,
    /// and its binding to every participant ServiceAccount: both named
    /// [`FencingPolicy::name`], `tenure-fencing.<namespace>.<lease>`, as the policy.
    pub token_extra: Option<(ClusterRole, ClusterRoleBinding)>,
    /// Participants that are users, not ServiceAccounts: their RBAC depends on how they
    /// authenticate (a user also impersonates its groups), so it is not generated.
    pub users_left_out: Vec<String>,
}

fn rule(group: &str, resource: &str, names: &[String], verbs: &[&str]) -> PolicyRule {
    PolicyRule {
        api_groups: Some(vec![group.to_owned()]),
        resources: Some(vec![resource.to_owned()]),
        resource_names: (!names.is_empty()).then(|| names.to_vec()),
        verbs: verbs.iter().map(|v| (*v).to_owned()).collect(),
        ..PolicyRule::default()
    }
}

fn meta(policy: &FencingPolicy, name: &str, namespace: Option<&str>) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.to_owned()),
        namespace: namespace.map(str::to_owned),
        labels: Some(policy.labels()),
        ..ObjectMeta::default()
    }
}

impl FencingPolicy {
    /// The RBAC each participant ServiceAccount needs to lead this election and carry its
    /// token: get, list, watch and update on the Lease by name, create on leases, create on
    /// events (the Role `tenure-worker.<lease>` in the Lease's namespace) — for a sharded
    /// group ([`shards`](Self::shards)), get, list, watch, update, patch, create and delete on
    /// leases of any name (its shard, record and member Leases), as `tenure run --shards`
    /// needs, and the same for an election whose replicas announce themselves in member
    /// Leases ([`member_leases`](Self::member_leases): `tenure run --prefer` or
    /// `--health-cmd`); `impersonate` on
    /// itself, by name (a Role of that name in the ServiceAccount's namespace); and
    /// `impersonate` on `userextras/tenure.dev/fencing-token` and
    /// `userextras/tenure.dev/fencing-election` (the ClusterRole and ClusterRoleBinding
    /// `tenure-fencing.<namespace>.<lease>`, [`name`](Self::name), like the policy's).
    /// Every object carries the election's labels (`tenure.dev/lease`,
    /// `tenure.dev/lease-namespace`), as the policy does.
    /// Impersonating yourself grants nothing you did not have. The workload's own access
    /// (what its command writes) is not included.
    #[must_use]
    pub fn worker_rbac(&self) -> WorkerRbac {
        let lease_ns = self.namespace();
        let name = format!("tenure-worker.{}", self.lease_name());
        let mut by_namespace: BTreeMap<String, Vec<String>> = BTreeMap::new();
        let mut users_left_out = Vec::new();
        for participant in self.participants() {
            match participant
                .strip_prefix("system:serviceaccount:")
                .and_then(|rest| rest.split_once(':'))
            {
                Some((ns, sa)) => by_namespace
                    .entry(ns.to_owned())
                    .or_default()
                    .push(sa.to_owned()),
                None => users_left_out.push(participant.clone()),
            }
        }
        let subjects = |only: Option<&str>| -> Vec<Subject> {
            by_namespace
                .iter()
                .filter(|(ns, _)| only.is_none_or(|o| o == ns.as_str()))
                .flat_map(|(ns, sas)| {
                    sas.iter().map(move |sa| Subject {
                        kind: "ServiceAccount".into(),
                        name: sa.clone(),
                        namespace: Some(ns.clone()),
                        api_group: None,
                    })
                })
                .collect()
        };
        let mut namespaces: Vec<&str> = by_namespace.keys().map(String::as_str).collect();
        if !by_namespace.is_empty() && !by_namespace.contains_key(lease_ns) {
            namespaces.insert(0, lease_ns);
        }
        let mut roles = Vec::new();
        for ns in namespaces {
            let mut rules = Vec::new();
            if ns == lease_ns && self.has_member_leases() {
                // One member Lease per replica, named after its identity (unknown in advance)
                // and found by a label-selected list and watch, written by a server-side apply
                // (`patch`), deleted when the replica leaves — a sharded group's, beside its
                // shard Leases and its record `<lease>-group`, or the ready followers' of an
                // election with a preference or a health policy. No resourceNames can list
                // them (the chart's Role is the same).
                rules.push(rule(
                    "coordination.k8s.io",
                    "leases",
                    &[],
                    &[
                        "get", "list", "watch", "update", "patch", "create", "delete",
                    ],
                ));
                rules.push(rule("", "events", &[], &["create"]));
            } else if ns == lease_ns {
                let lease = [self.lease_name().to_owned()];
                rules.push(rule(
                    "coordination.k8s.io",
                    "leases",
                    &lease,
                    &["get", "list", "watch", "update"],
                ));
                rules.push(rule("coordination.k8s.io", "leases", &[], &["create"]));
                rules.push(rule("", "events", &[], &["create"]));
            }
            if let Some(sas) = by_namespace.get(ns) {
                rules.push(rule("", "serviceaccounts", sas, &["impersonate"]));
            }
            let role = Role {
                metadata: meta(self, &name, Some(ns)),
                rules: Some(rules),
            };
            // The Lease's namespace binds every participant; another namespace its own.
            let bound = subjects((ns != lease_ns).then_some(ns));
            let binding = RoleBinding {
                metadata: meta(self, &name, Some(ns)),
                role_ref: RoleRef {
                    api_group: Some("rbac.authorization.k8s.io".into()),
                    kind: "Role".into(),
                    name: name.clone(),
                },
                subjects: Some(bound),
            };
            roles.push((role, binding));
        }
        let token_extra = (!by_namespace.is_empty()).then(|| {
            let role = ClusterRole {
                metadata: meta(self, &self.name(), None),
                rules: Some(vec![PolicyRule {
                    api_groups: Some(vec!["authentication.k8s.io".to_owned()]),
                    resources: Some(vec![
                        format!("userextras/{REQUEST_TOKEN_EXTRA}"),
                        format!("userextras/{REQUEST_ELECTION_EXTRA}"),
                    ]),
                    verbs: vec!["impersonate".to_owned()],
                    ..PolicyRule::default()
                }]),
                ..ClusterRole::default()
            };
            let binding = ClusterRoleBinding {
                metadata: meta(self, &self.name(), None),
                role_ref: RoleRef {
                    api_group: Some("rbac.authorization.k8s.io".into()),
                    kind: "ClusterRole".into(),
                    name: self.name(),
                },
                subjects: Some(subjects(None)),
            };
            (role, binding)
        });
        WorkerRbac {
            roles,
            token_extra,
            users_left_out,
        }
    }

    /// [`worker_rbac`](Self::worker_rbac) as YAML documents for `kubectl apply -f -`, after a
    /// comment that says what they grant.
    #[must_use]
    pub fn worker_rbac_yaml(&self) -> String {
        const RBAC: &str = "rbac.authorization.k8s.io/v1";
        let rbac = self.worker_rbac();
        let mut docs = Vec::new();
        for (role, binding) in &rbac.roles {
            docs.push(super::policy::to_yaml_doc(role, RBAC, "Role"));
            docs.push(super::policy::to_yaml_doc(binding, RBAC, "RoleBinding"));
        }
        if let Some((role, binding)) = &rbac.token_extra {
            docs.push(super::policy::to_yaml_doc(role, RBAC, "ClusterRole"));
            docs.push(super::policy::to_yaml_doc(
                binding,
                RBAC,
                "ClusterRoleBinding",
            ));
        }
        let what = if self.shard_count().is_some() {
            "sharded group"
        } else {
            "lease"
        };
        let members = if self.has_member_leases() && self.shard_count().is_none() {
            // The ready group's member Leases (`health_group`), as the backend names them.
            format!(
                " and its replicas' member Leases {}-member-* (--prefer, --health-cmd)",
                crate::election::health_group(self.lease_name())
            )
        } else {
            String::new()
        };
        let mut out = format!(
            "# What each participant of {what} {}/{}{members} needs to lead and carry its fencing token\n\
             # (tenure run, with --fence or a Fencer): its Lease and Events, impersonating itself,\n\
             # and the user extras of the token and the election (the ClusterRole {}).\n\
             # Its command's own access is yours to add.\n",
            self.namespace(),
            self.lease_name(),
            self.name()
        );
        out.push_str(&docs.join("---\n"));
        for user in &rbac.users_left_out {
            out.push_str(&format!(
                "# participant {user:?} is a user: grant it impersonate on users/{user:?} (and on each of its groups) and on userextras/{REQUEST_TOKEN_EXTRA} and userextras/{REQUEST_ELECTION_EXTRA} yourself\n"
            ));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn service_accounts_get_their_lease_self_impersonation_and_the_token_extra() {
        let one = |v: &str| Some(vec![v.to_owned()]);
        let policy = FencingPolicy::new("jobs", "nightly")
            .and_then(|p| p.service_account("jobs", "worker"))
            .and_then(|p| p.service_account("other", "helper"))
            .and_then(|p| p.user("alice"))
            .expect("valid policy");
        let rbac = policy.worker_rbac();
        assert_eq!(rbac.roles.len(), 2);
        let (lease_role, lease_binding) = &rbac.roles[0];
        assert_eq!(lease_role.metadata.namespace.as_deref(), Some("jobs"));
        assert_eq!(
            lease_role.metadata.name.as_deref(),
            Some("tenure-worker.nightly")
        );
        assert_eq!(
            lease_role
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get("app.kubernetes.io/managed-by"))
                .map(String::as_str),
            Some("tenure")
        );
        let rules = lease_role.rules.clone().unwrap_or_default();
        let has = |group: &str, resource: &str, names: Option<Vec<String>>, verbs: &[&str]| {
            rules.iter().any(|r| {
                r.api_groups == one(group)
                    && r.resources == one(resource)
                    && r.resource_names == names
                    && r.verbs == verbs
            })
        };
        assert!(has(
            "coordination.k8s.io",
            "leases",
            one("nightly"),
            &["get", "list", "watch", "update"]
        ));
        assert!(has("coordination.k8s.io", "leases", None, &["create"]));
        assert!(has("", "events", None, &["create"]));
        assert!(has("", "serviceaccounts", one("worker"), &["impersonate"]));
        assert_eq!(rules.len(), 4);
        assert_eq!(lease_binding.role_ref.kind, "Role");
        assert_eq!(lease_binding.role_ref.name, "tenure-worker.nightly");
        let bound: Vec<_> = lease_binding
            .subjects
            .clone()
            .unwrap_or_default()
            .into_iter()
            .map(|s| format!("{}:{}/{}", s.kind, s.namespace.unwrap_or_default(), s.name))
            .collect();
        assert_eq!(
            bound,
            ["ServiceAccount:jobs/worker", "ServiceAccount:other/helper"]
        );
        let (other_role, other_binding) = &rbac.roles[1];
        assert_eq!(other_role.metadata.namespace.as_deref(), Some("other"));
        assert_eq!(
            other_role.metadata.name.as_deref(),
            Some("tenure-worker.nightly")
        );
        assert_eq!(
            other_role.rules.clone().unwrap_or_default()[0].resource_names,
            one("helper"),
            "only the lease's namespace gets lease rules"
        );
        assert_eq!(other_role.rules.as_ref().map(Vec::len), Some(1));
        assert_eq!(other_binding.subjects.as_ref().map(Vec::len), Some(1));
        let (extra, extra_binding) = rbac.token_extra.expect("service accounts need the extra");
        // The election's own, named as its policy: a Helm release owning a shared one would
        // delete it with itself.
        assert_eq!(
            extra.metadata.name.as_deref(),
            Some("tenure-fencing.jobs.nightly")
        );
        assert_eq!(extra.metadata.labels.as_ref(), Some(&policy.labels()));
        assert_eq!(
            policy.labels().get("tenure.dev/lease").map(String::as_str),
            Some("nightly")
        );
        assert_eq!(extra.metadata.namespace, None);
        let extra_rule = &extra.rules.unwrap_or_default()[0];
        assert_eq!(extra_rule.api_groups, one("authentication.k8s.io"));
        assert_eq!(
            extra_rule.resources,
            Some(vec![
                "userextras/tenure.dev/fencing-token".to_owned(),
                "userextras/tenure.dev/fencing-election".to_owned()
            ])
        );
        assert_eq!(extra_rule.verbs, ["impersonate"]);
        assert_eq!(
            extra_binding.metadata.name.as_deref(),
            Some("tenure-fencing.jobs.nightly")
        );
        assert_eq!(extra_binding.role_ref.kind, "ClusterRole");
        assert_eq!(extra_binding.role_ref.name, "tenure-fencing.jobs.nightly");
        assert_eq!(
            lease_binding.metadata.labels.as_ref(),
            Some(&policy.labels())
        );
        assert_eq!(extra_binding.subjects.map(|s| s.len()), Some(2));
        assert_eq!(rbac.users_left_out, ["alice"]);
        let yaml = policy.worker_rbac_yaml();
        assert_eq!(yaml.matches("\nkind: Role\n").count(), 2, "{yaml}");
        assert!(yaml.contains("kind: ClusterRoleBinding"), "{yaml}");
        assert!(yaml.contains("participant \"alice\" is a user"), "{yaml}");

        // A sharded group: its shard, record and member Leases, named or not.
        let group = FencingPolicy::new("jobs", "nightly")
            .and_then(|p| p.service_account("jobs", "worker"))
            .and_then(|p| p.shards(8))
            .expect("valid policy")
            .worker_rbac();
        let rules = group.roles[0].0.rules.clone().unwrap_or_default();
        assert_eq!(rules.len(), 3, "{rules:?}");
        assert_eq!(rules[0].resources, one("leases"));
        assert_eq!(rules[0].resource_names, None);
        assert_eq!(
            rules[0].verbs,
            [
                "get", "list", "watch", "update", "patch", "create", "delete"
            ]
        );
        assert_eq!(rules[1].resources, one("events"));
        assert_eq!(rules[2].resource_names, one("worker"));
        assert!(group.token_extra.is_some());
        let yaml = FencingPolicy::new("jobs", "nightly")
            .and_then(|p| p.service_account("jobs", "worker"))
            .and_then(|p| p.shards(8))
            .expect("valid policy")
            .worker_rbac_yaml();
        assert!(
            yaml.starts_with("# What each participant of sharded group jobs/nightly"),
            "{yaml}"
        );

        // Member Leases (a preference or a health policy): the group's Lease rule, not the
        // Lease by name; the policy itself is unchanged (it governs no Lease but the probes).
        let plain = FencingPolicy::new("jobs", "nightly")
            .and_then(|p| p.service_account("jobs", "worker"))
            .expect("valid policy");
        assert!(!plain.has_member_leases());
        let announcing = plain.clone().member_leases();
        assert!(announcing.has_member_leases());
        assert_eq!(announcing.policy(), plain.policy());
        assert_eq!(announcing.binding(), plain.binding());
        let members = announcing.worker_rbac();
        let rules = members.roles[0].0.rules.clone().unwrap_or_default();
        assert_eq!(
            rules,
            group.roles[0].0.rules.clone().unwrap_or_default(),
            "a sharded group's rules"
        );
        let yaml = announcing.worker_rbac_yaml();
        assert!(
            yaml.starts_with(
                "# What each participant of lease jobs/nightly and its replicas' member Leases \
                 nightly-healthy-member-* (--prefer, --health-cmd) needs"
            ),
            "{yaml}"
        );
        assert!(
            !plain.worker_rbac_yaml().contains("member Leases"),
            "{}",
            plain.worker_rbac_yaml()
        );
        assert!(
            sharded_member_leases_are_the_groups(),
            "a group announcing member Leases is still a group"
        );

        // Only users: nothing to bind, so no ClusterRole either.
        let users = FencingPolicy::new("jobs", "nightly")
            .and_then(|p| p.user("bob"))
            .expect("valid policy")
            .worker_rbac();
        assert!(users.roles.is_empty() && users.token_extra.is_none());
        // A ServiceAccount elsewhere: the Lease's namespace still gets the lease rules.
        let elsewhere = FencingPolicy::new("jobs", "nightly")
            .and_then(|p| p.service_account("other", "helper"))
            .expect("valid policy")
            .worker_rbac();
        let namespaces: Vec<_> = elsewhere
            .roles
            .iter()
            .map(|(r, b)| {
                (
                    r.metadata.namespace.clone().unwrap_or_default(),
                    r.rules.as_ref().map_or(0, Vec::len),
                    b.subjects.as_ref().map_or(0, Vec::len),
                )
            })
            .collect();
        assert_eq!(
            namespaces,
            [("jobs".to_owned(), 3, 1), ("other".to_owned(), 1, 1)]
        );
    }

    /// `member_leases` on a sharded group changes nothing: its RBAC already covers them.
    fn sharded_member_leases_are_the_groups() -> bool {
        let group = FencingPolicy::new("jobs", "nightly")
            .and_then(|p| p.service_account("jobs", "worker"))
            .and_then(|p| p.shards(8))
            .expect("valid policy");
        group.has_member_leases()
            && group.worker_rbac_yaml() == group.clone().member_leases().worker_rbac_yaml()
    }
}
