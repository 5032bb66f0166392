//! The Lease record as client-go writes it, tenure's annotations beside it, and the lock-name rule.
//!
//! # What tenure owns in a Lease, and what it keeps
//!
//! Tenure owns five fields of `spec` — `holderIdentity`, `leaseDurationSeconds`,
//! `acquireTime`, `renewTime` and `leaseTransitions` — and its annotations under
//! [`ANNOTATION_PREFIX`]. Every write (acquire, takeover, renewal, the fencing stamp, release)
//! starts from the Lease as it was read and changes only those; everything else is written
//! back as it was: `spec.strategy` and `spec.preferredHolder` (coordinated leader election,
//! KEP-4355), labels, other annotations, owner references. (client-go's own elector clears
//! `strategy` and `preferredHolder` on every write outside coordinated mode; tenure does
//! not.) The one limit: tenure reads the Lease as k8s-openapi's `v1_36` type, so a `spec`
//! field added after Kubernetes 1.36 is unknown to it and would be dropped by its writes.
//!
//! # Coordinated leader election
//!
//! Tenure is not a coordinated-election participant: it registers no `LeaseCandidate`. It
//! honours the step-down signal: [`View::handoff`] reads a `preferredHolder` naming someone
//! other than the holder as a request to hand over, which a tenure elector holding the Lease
//! acts on (a release that only that identity may follow, for the hand-off window). It does
//! not keep other candidates out of a free Lease by `preferredHolder` (a stale value, in a
//! field tenure neither owns nor clears, would then shut every tenure candidate out), and
//! never writes it (the API server drops the field unless the `CoordinatedLeaderElection`
//! feature gate is on): tenure's own hand-overs are the [`HANDOFF_TO`] and
//! [`HANDOFF_WINDOW_MS`] annotations, bounded by their window. When the API server's
//! coordinated-leader-election controller does manage the Lease, the holder it writes has no
//! tenure annotations, so tenure treats it as a foreign holder, as it treats client-go. Give
//! tenure its own Lease rather than one that coordinated election manages.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};

use crate::backend::{
    BackendError, BackendErrorKind, FencingToken, Handoff, HolderToken, InvalidName,
};

/// The prefix of every annotation tenure writes.
pub const ANNOTATION_PREFIX: &str = "tenure.dev/";
/// The holder token of the current tenure term (32 hex digits).
pub const HOLDER_TOKEN: &str = "tenure.dev/holder-token";
/// The identity the holder token was issued to; a token whose identity differs from
/// `spec.holderIdentity` is stale (another elector, such as client-go, took the Lease over
/// and kept the annotations).
pub const HOLDER_IDENTITY: &str = "tenure.dev/holder-identity";
/// The fencing token of the current tenure term: the resourceVersion of the acquiring write.
/// Written by the holder's first renewal (the acquiring write cannot know its own
/// resourceVersion); until then the term's token is the record's resourceVersion itself.
pub const FENCING: &str = "tenure.dev/fencing";
/// The holder token that released the Lease last, so a replayed release reports success.
pub const RELEASED_TOKEN: &str = "tenure.dev/released-token";
/// Who released the Lease last, `<fencing token>:<identity>` (`-` for a token not yet
/// stamped): what `tenure status` shows of a free Lease. Read as untrusted.
pub const RELEASED_BY: &str = "tenure.dev/released-by";
/// The lowest fencing token the current term accepts: every token issued before the term is
/// below it, the term's own token is not. The API server's fencing policy
/// ([`crate::fence::kube`]) refuses a participant's write whose token is lower.
///
/// Written **by the acquiring write itself**, so the policy refuses the previous leader from
/// the instant the new term is granted: on a takeover it is one above the observed
/// `resourceVersion` (the previous holder's token is at most that version; the new term's
/// token, the acquiring write's version, is above it). On a create, no earlier version of the
/// Lease is known, so it is one above the highest version this backend has seen, and the
/// stamp that follows every grant at once raises it to the term's exact token. Kept on
/// release, and kept (never lowered) by client-go, which preserves annotations.
pub const FENCING_FLOOR: &str = "tenure.dev/fencing-floor";

/// A hand-over: the identity that alone may take the Lease next (empty: anyone; a request to
/// the holder to step down), written by `release_to` and `request_handoff`, removed by the
/// next grant. An annotation rather than `spec.preferredHolder`: the API server drops that
/// field unless the `CoordinatedLeaderElection` feature gate is on.
pub const HANDOFF_TO: &str = "tenure.dev/handoff-to";
/// How long, in milliseconds, [`HANDOFF_TO`] keeps other candidates out of the released
/// Lease: measured by each candidate on its own clock from when it first saw the release, as
/// expiry is.
pub const HANDOFF_WINDOW_MS: &str = "tenure.dev/handoff-window-ms";

/// The longest Lease name Kubernetes accepts (a DNS-1123 subdomain).
pub const MAX_NAME_LEN: usize = 253;

/// Whether `s` is a DNS-1123 label (what namespaces are): 1 to 63 lowercase alphanumeric
/// characters or '-', starting and ending with an alphanumeric character.
pub(crate) fn is_dns1123_label(s: &str) -> bool {
    let b = s.as_bytes();
    let alnum = |c: &u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    !b.is_empty()
        && b.len() <= 63
        && b.first().is_some_and(alnum)
        && b.last().is_some_and(alnum)
        && b.iter().all(|c| alnum(c) || *c == b'-')
}

/// Checks `name` against Kubernetes' rule for object names (a DNS-1123 subdomain).
pub fn validate_name(name: &str) -> Result<(), InvalidName> {
    const RULE: &str = "a Lease name must be a lowercase RFC 1123 subdomain: lowercase \
        alphanumeric characters, '-' or '.', starting and ending with an alphanumeric \
        character, each '.'-separated part non-empty";
    if name.is_empty() {
        return Err(InvalidName::new(name, "must not be empty"));
    }
    if name.len() > MAX_NAME_LEN {
        return Err(InvalidName::new(
            name,
            format!("must be at most {MAX_NAME_LEN} characters (a DNS-1123 subdomain)"),
        ));
    }
    let label_ok = |label: &str| {
        let b = label.as_bytes();
        let alnum = |c: &u8| c.is_ascii_lowercase() || c.is_ascii_digit();
        !b.is_empty()
            && b.first().is_some_and(alnum)
            && b.last().is_some_and(alnum)
            && b.iter().all(|c| alnum(c) || *c == b'-')
    };
    if name.split('.').all(label_ok) {
        Ok(())
    } else {
        Err(InvalidName::new(name, RULE))
    }
}

/// `ttl` rounded up to whole seconds, at least 1: the record's `leaseDurationSeconds`.
pub fn lease_duration_seconds(ttl: Duration) -> i32 {
    let secs = ttl
        .as_secs()
        .saturating_add(u64::from(ttl.subsec_nanos() > 0));
    i32::try_from(secs.max(1)).unwrap_or(i32::MAX)
}

/// Parses a resourceVersion as the u64 it is on etcd-backed servers (comparable by contract
/// since Kubernetes 1.35, KEP-5504). Anything else fails closed.
pub fn parse_resource_version(lease: &Lease) -> Result<u64, BackendError> {
    let rv = lease.metadata.resource_version.as_deref().unwrap_or("");
    rv.parse::<u64>().map_err(|_| {
        BackendError::new(
            BackendErrorKind::Protocol,
            format!(
                "the Lease's resourceVersion {rv:?} is not an unsigned integer, so it cannot \
                 serve as a fencing token; tenure needs an etcd-backed API server \
                 (Kubernetes 1.35+ guarantees comparable resourceVersions)"
            ),
        )
    })
}

/// What tenure reads from a Lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct View {
    /// `spec.holderIdentity` when non-empty.
    pub holder: Option<String>,
    /// `spec.leaseDurationSeconds` (0 when absent or negative: expired at once, as client-go
    /// reads it).
    pub duration: Duration,
    /// The tenure holder token, when it belongs to the current holder.
    pub token: Option<HolderToken>,
    /// The fencing annotation, when `token` is set and the annotation is present.
    pub fencing: Option<FencingToken>,
    /// The holder token that released last.
    pub released: Option<HolderToken>,
    /// `spec.leaseTransitions`.
    pub transitions: i32,
    /// A hand-over recorded by tenure ([`HANDOFF_TO`]) and its window, or else one a cluster
    /// asked for through `spec.preferredHolder` naming someone other than the holder (window
    /// zero: it asks the holder to step down, and keeps nobody out).
    pub handoff: Option<(Handoff, Duration)>,
    /// Whether `handoff` comes from `spec.preferredHolder` rather than tenure's annotations.
    pub handoff_preferred: bool,
}

fn annotation<'a>(lease: &'a Lease, key: &str) -> Option<&'a str> {
    lease
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(key))
        .map(String::as_str)
}

impl View {
    /// Reads `lease`.
    ///
    /// A malformed tenure annotation is treated as absent: the record is then foreign, which
    /// can only make tenure wait longer, never grant.
    pub fn of(lease: &Lease) -> Self {
        let spec = lease.spec.as_ref();
        let holder = spec
            .and_then(|s| s.holder_identity.clone())
            .filter(|h| !h.is_empty());
        let duration = spec
            .and_then(|s| s.lease_duration_seconds)
            .and_then(|s| u64::try_from(s).ok())
            .map_or(Duration::ZERO, Duration::from_secs);
        let token = match (&holder, annotation(lease, HOLDER_IDENTITY)) {
            (Some(h), Some(id)) if h == id => {
                annotation(lease, HOLDER_TOKEN).and_then(HolderToken::from_hex)
            }
            _ => None,
        };
        let fencing = token
            .and(annotation(lease, FENCING))
            .and_then(|f| f.parse::<u64>().ok())
            .map(FencingToken::new);
        let handoff = handoff_of(lease, holder.as_deref());
        let handoff_preferred = handoff.is_some() && annotation(lease, HANDOFF_TO).is_none();
        Self {
            holder,
            duration,
            token,
            fencing,
            released: annotation(lease, RELEASED_TOKEN).and_then(HolderToken::from_hex),
            transitions: spec.and_then(|s| s.lease_transitions).unwrap_or(0),
            handoff,
            handoff_preferred,
        }
    }

    /// The fencing token of the record's current term, read at resourceVersion `rv`.
    ///
    /// A tenure term's annotation once stamped, else `rv` (which is the acquiring write's
    /// until the first renewal stamps it). A foreign holder (client-go) has no fencing token;
    /// its term is named by `rv`.
    pub fn term_fencing(&self, rv: u64) -> FencingToken {
        self.fencing.unwrap_or(FencingToken::new(rv))
    }
}

/// The hand-over `lease` records; see [`View::handoff`]. A target longer than any identity,
/// or a window that is not a number, is ignored.
fn handoff_of(lease: &Lease, holder: Option<&str>) -> Option<(Handoff, Duration)> {
    if let Some(to) = annotation(lease, HANDOFF_TO) {
        let window = annotation(lease, HANDOFF_WINDOW_MS)
            .and_then(|w| w.parse::<u64>().ok())
            .map(Duration::from_millis)?;
        return match to {
            "" => Some((Handoff::Anyone, window)),
            to if to.len() <= crate::backend::types::MAX_IDENTITY_LEN => {
                Some((Handoff::To(to.to_owned()), window))
            }
            _ => None,
        };
    }
    let preferred = lease
        .spec
        .as_ref()?
        .preferred_holder
        .as_deref()
        .filter(|p| !p.is_empty() && p.len() <= crate::backend::types::MAX_IDENTITY_LEN)?;
    (holder.is_some_and(|h| h != preferred))
        .then(|| (Handoff::To(preferred.to_owned()), Duration::ZERO))
}

/// Records `handoff` with `window` in `lease`'s annotations.
pub fn hand_over(lease: &mut Lease, handoff: &Handoff, window: Duration) {
    let a = annotations_mut(lease);
    a.insert(
        HANDOFF_TO.to_owned(),
        handoff.target().unwrap_or_default().to_owned(),
    );
    a.insert(
        HANDOFF_WINDOW_MS.to_owned(),
        u64::try_from(window.as_millis())
            .unwrap_or(u64::MAX)
            .to_string(),
    );
}

fn now() -> MicroTime {
    MicroTime(k8s_openapi::jiff::Timestamp::now())
}

fn annotations_mut(lease: &mut Lease) -> &mut BTreeMap<String, String> {
    lease.metadata.annotations.get_or_insert_with(BTreeMap::new)
}

/// A new Lease `name` in `namespace` held by `holder`/`identity`, as client-go creates it,
/// with `floor` as its [`FENCING_FLOOR`].
pub fn created(
    namespace: &str,
    name: &str,
    holder: &HolderToken,
    identity: &str,
    ttl: Duration,
    floor: u64,
) -> Lease {
    let mut lease = Lease {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            namespace: Some(namespace.to_owned()),
            ..ObjectMeta::default()
        },
        spec: None,
    };
    take_over(&mut lease, holder, identity, ttl, floor);
    lease
}

/// Rewrites `lease` as a new term of `holder`/`identity`, exactly as client-go's acquiring
/// update does: transitions +1 unless the previous holder had the same identity. `floor`
/// becomes the [`FENCING_FLOOR`] unless the record already has a higher one. The `spec`
/// fields tenure does not own are kept (see the [module docs](self)).
pub fn take_over(
    lease: &mut Lease,
    holder: &HolderToken,
    identity: &str,
    ttl: Duration,
    floor: u64,
) {
    let previous = lease.spec.take();
    let same_identity =
        previous.as_ref().and_then(|s| s.holder_identity.as_deref()) == Some(identity);
    let transitions = previous
        .as_ref()
        .and_then(|s| s.lease_transitions)
        .unwrap_or(0);
    let transitions = if previous.is_none() || same_identity {
        transitions
    } else {
        transitions.saturating_add(1)
    };
    let now = now();
    lease.spec = Some(LeaseSpec {
        holder_identity: Some(identity.to_owned()),
        lease_duration_seconds: Some(lease_duration_seconds(ttl)),
        acquire_time: Some(now.clone()),
        renew_time: Some(now),
        lease_transitions: Some(transitions),
        // Everything tenure does not own (strategy, preferredHolder) as it was.
        ..previous.unwrap_or_default()
    });
    let a = annotations_mut(lease);
    a.insert(HOLDER_TOKEN.to_owned(), holder.to_hex());
    a.insert(HOLDER_IDENTITY.to_owned(), identity.to_owned());
    a.remove(FENCING);
    a.remove(HANDOFF_TO);
    a.remove(HANDOFF_WINDOW_MS);
    raise_floor(a, floor);
}

/// Sets [`FENCING_FLOOR`] to `floor` unless it is already higher: the floor never goes down.
fn raise_floor(a: &mut BTreeMap<String, String>, floor: u64) {
    let current = a
        .get(FENCING_FLOOR)
        .and_then(|f| f.parse::<u64>().ok())
        .unwrap_or(0);
    if floor > current {
        a.insert(FENCING_FLOOR.to_owned(), floor.to_string());
    }
}

#[cfg(test)]
/// The [`FENCING_FLOOR`] `lease` records (0 when absent or malformed).
pub fn fencing_floor(lease: &Lease) -> u64 {
    annotation(lease, FENCING_FLOOR)
        .and_then(|f| f.parse::<u64>().ok())
        .unwrap_or(0)
}

/// Rewrites `lease` as a renewal by its current holder: renewTime now, the duration from
/// `ttl`, acquireTime and transitions kept (client-go's renewal), and the term's fencing
/// token stamped when known. Every other field is kept.
pub fn renewed(lease: &mut Lease, ttl: Duration, fencing: Option<FencingToken>) {
    let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
    spec.renew_time = Some(now());
    spec.lease_duration_seconds = Some(lease_duration_seconds(ttl));
    if let Some(f) = fencing {
        let a = annotations_mut(lease);
        a.insert(FENCING.to_owned(), f.get().to_string());
        raise_floor(a, f.get());
    }
}

/// Rewrites `lease` as released by `holder`, exactly as client-go's `ReleaseOnCancel` does
/// (holder cleared, leaseDurationSeconds 1, acquireTime and renewTime now, transitions kept),
/// remembering the holder token so that a replayed release reports success. The `spec`
/// fields tenure does not own are kept (see the [module docs](self)).
pub fn released(lease: &mut Lease, holder: &HolderToken) {
    let previous = lease.spec.take().unwrap_or_default();
    let by = format!(
        "{}:{}",
        annotation(lease, FENCING).unwrap_or("-"),
        previous.holder_identity.as_deref().unwrap_or_default()
    );
    let now = now();
    lease.spec = Some(LeaseSpec {
        holder_identity: Some(String::new()),
        lease_duration_seconds: Some(1),
        acquire_time: Some(now.clone()),
        renew_time: Some(now),
        lease_transitions: Some(previous.lease_transitions.unwrap_or(0)),
        // Everything tenure does not own (strategy, preferredHolder) as it was.
        ..previous
    });
    let a = annotations_mut(lease);
    a.remove(HOLDER_TOKEN);
    a.remove(HOLDER_IDENTITY);
    a.remove(FENCING);
    a.insert(RELEASED_TOKEN.to_owned(), holder.to_hex());
    a.insert(RELEASED_BY.to_owned(), by);
}

/// Who released `lease` last ([`RELEASED_BY`]): (fencing token, identity), each `None` when
/// absent or malformed.
pub fn released_by(lease: &Lease) -> (Option<FencingToken>, Option<String>) {
    let Some((fencing, identity)) = annotation(lease, RELEASED_BY).and_then(|v| v.split_once(':'))
    else {
        return (None, None);
    };
    let fencing = (fencing.len() <= 20 && fencing.bytes().all(|b| b.is_ascii_digit()))
        .then(|| fencing.parse().ok())
        .flatten()
        .filter(|&f| f > 0)
        .map(FencingToken::new);
    let identity = (!identity.is_empty()
        && identity.len() <= crate::backend::types::MAX_IDENTITY_LEN
        && !identity.chars().any(char::is_control))
    .then(|| identity.to_owned());
    (fencing, identity)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_dns_1123_subdomain_rules() {
        for ok in ["a", "my-lock", "a.b-c.d", "0", "x".repeat(253).as_str()] {
            assert!(validate_name(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "A",
            "-a",
            "a-",
            "a..b",
            ".a",
            "a.",
            "a_b",
            "a b",
            "é",
            "x".repeat(254).as_str(),
        ] {
            let err = validate_name(bad).expect_err(bad);
            assert!(!err.rule.is_empty());
        }
        assert!(
            validate_name(&"x".repeat(254))
                .expect_err("too long")
                .rule
                .contains("253")
        );
    }

    #[test]
    fn durations_round_up_to_whole_seconds() {
        assert_eq!(lease_duration_seconds(Duration::from_millis(1)), 1);
        assert_eq!(lease_duration_seconds(Duration::ZERO), 1);
        assert_eq!(lease_duration_seconds(Duration::from_secs(15)), 15);
        assert_eq!(lease_duration_seconds(Duration::from_millis(15_001)), 16);
        assert_eq!(lease_duration_seconds(Duration::MAX), i32::MAX);
    }

    fn with_rv(mut lease: Lease, rv: &str) -> Lease {
        lease.metadata.resource_version = Some(rv.to_owned());
        lease
    }

    #[test]
    fn resource_versions_must_be_integers() {
        let lease = created(
            "ns",
            "x",
            &HolderToken::random(),
            "me",
            Duration::from_secs(1),
            1,
        );
        assert_eq!(
            parse_resource_version(&with_rv(lease.clone(), "42")).ok(),
            Some(42)
        );
        for bad in ["", "abc", "-1", "1.5"] {
            let e = parse_resource_version(&with_rv(lease.clone(), bad)).expect_err(bad);
            assert_eq!(e.kind(), BackendErrorKind::Protocol);
        }
    }

    #[test]
    fn record_cycle_matches_client_go() {
        let a = HolderToken::random();
        let mut lease = created("ns", "x", &a, "alpha", Duration::from_millis(1500), 3);
        assert_eq!(fencing_floor(&lease), 3);
        let spec = lease.spec.clone().expect("spec");
        assert_eq!(spec.holder_identity.as_deref(), Some("alpha"));
        assert_eq!(spec.lease_duration_seconds, Some(2));
        assert_eq!(spec.lease_transitions, Some(0));
        assert_eq!(spec.acquire_time, spec.renew_time);
        let v = View::of(&lease);
        assert_eq!(v.token, Some(a));
        assert_eq!(v.fencing, None);
        assert_eq!(v.term_fencing(7), FencingToken::new(7));

        renewed(
            &mut lease,
            Duration::from_secs(3),
            Some(FencingToken::new(7)),
        );
        let v = View::of(&lease);
        assert_eq!(v.duration, Duration::from_secs(3));
        assert_eq!(v.term_fencing(9), FencingToken::new(7));
        assert_eq!(
            fencing_floor(&lease),
            7,
            "the stamp raises the floor to the token"
        );
        assert_eq!(
            lease.spec.as_ref().and_then(|s| s.lease_transitions),
            Some(0)
        );

        released(&mut lease, &a);
        let v = View::of(&lease);
        assert_eq!(v.holder, None);
        assert_eq!(v.token, None);
        assert_eq!(v.released, Some(a));
        assert_eq!(v.duration, Duration::from_secs(1));
        let spec = lease.spec.clone().expect("spec");
        assert_eq!(spec.holder_identity.as_deref(), Some(""));
        assert_eq!(spec.lease_transitions, Some(0));
        assert_eq!(fencing_floor(&lease), 7, "a release keeps the floor");

        // A new holder: transitions +1, token replaced, the release memo kept.
        let b = HolderToken::random();
        take_over(&mut lease, &b, "beta", Duration::from_secs(1), 10);
        assert_eq!(fencing_floor(&lease), 10);
        let v = View::of(&lease);
        assert_eq!(v.token, Some(b));
        assert_eq!(v.transitions, 1);
        assert_eq!(v.released, Some(a));
        // The same identity again (after its own expiry): client-go keeps the count.
        let c = HolderToken::random();
        take_over(&mut lease, &c, "beta", Duration::from_secs(1), 4);
        assert_eq!(View::of(&lease).transitions, 1);
        assert_eq!(fencing_floor(&lease), 10, "the floor never goes down");
    }

    /// Every rewrite changes only the fields tenure owns.
    #[test]
    fn a_handoff_is_read_from_tenure_annotations_or_a_foreign_preferred_holder() {
        let mut lease = created(
            "ns",
            "l",
            &HolderToken::random(),
            "a",
            Duration::from_secs(15),
            1,
        );
        assert_eq!(View::of(&lease).handoff, None);
        hand_over(
            &mut lease,
            &Handoff::To("b".into()),
            Duration::from_millis(4000),
        );
        assert_eq!(
            View::of(&lease).handoff,
            Some((Handoff::To("b".into()), Duration::from_millis(4000)))
        );
        assert!(!View::of(&lease).handoff_preferred, "tenure's own request");
        // The next grant clears tenure's hand-over.
        take_over(
            &mut lease,
            &HolderToken::random(),
            "b",
            Duration::from_secs(15),
            2,
        );
        assert_eq!(View::of(&lease).handoff, None);
        // A cluster's preferredHolder naming someone else asks the holder to step down;
        // naming the holder itself, it asks nothing.
        if let Some(spec) = lease.spec.as_mut() {
            spec.preferred_holder = Some("c".into());
        }
        assert_eq!(
            View::of(&lease).handoff,
            Some((Handoff::To("c".into()), Duration::ZERO))
        );
        assert!(View::of(&lease).handoff_preferred, "the cluster's request");
        if let Some(spec) = lease.spec.as_mut() {
            spec.preferred_holder = Some("b".into());
        }
        assert_eq!(View::of(&lease).handoff, None);
        // A window that is not a number: ignored.
        hand_over(&mut lease, &Handoff::Anyone, Duration::from_secs(1));
        if let Some(a) = lease.metadata.annotations.as_mut() {
            a.insert(HANDOFF_WINDOW_MS.to_owned(), "soon".to_owned());
        }
        assert_eq!(View::of(&lease).handoff, None);
    }

    #[test]
    fn every_write_keeps_the_spec_fields_tenure_does_not_own() {
        let a = HolderToken::random();
        let mut lease = created("ns", "x", &a, "alpha", Duration::from_secs(1), 1);
        if let Some(spec) = lease.spec.as_mut() {
            spec.strategy = Some("OldestEmulationVersion".into());
            spec.preferred_holder = Some("go-2".into());
        }
        lease.metadata.labels = Some(BTreeMap::from([("team".into(), "ops".into())]));
        let kept = |lease: &Lease, step: &str| {
            let spec = lease.spec.as_ref().expect("spec");
            assert_eq!(
                spec.strategy.as_deref(),
                Some("OldestEmulationVersion"),
                "{step}"
            );
            assert_eq!(spec.preferred_holder.as_deref(), Some("go-2"), "{step}");
            assert_eq!(
                lease.metadata.labels.as_ref().and_then(|l| l.get("team")),
                Some(&"ops".to_owned()),
                "{step}"
            );
        };
        renewed(
            &mut lease,
            Duration::from_secs(1),
            Some(FencingToken::new(3)),
        );
        kept(&lease, "renewal");
        released(&mut lease, &a);
        kept(&lease, "release");
        take_over(
            &mut lease,
            &HolderToken::random(),
            "beta",
            Duration::from_secs(1),
            5,
        );
        kept(&lease, "takeover");
        assert_eq!(View::of(&lease).holder.as_deref(), Some("beta"));
        assert_eq!(View::of(&lease).transitions, 1);
    }

    #[test]
    fn a_foreign_takeover_invalidates_a_kept_token() {
        let a = HolderToken::random();
        let mut lease = created("ns", "x", &a, "rust-1", Duration::from_secs(1), 1);
        renewed(
            &mut lease,
            Duration::from_secs(1),
            Some(FencingToken::new(5)),
        );
        // client-go rewrites the spec and keeps the metadata it read.
        if let Some(spec) = lease.spec.as_mut() {
            spec.holder_identity = Some("go-1".into());
        }
        let v = View::of(&lease);
        assert_eq!(v.holder.as_deref(), Some("go-1"));
        assert_eq!(v.token, None);
        assert_eq!(
            v.fencing, None,
            "the old term's fencing must not leak into go-1's"
        );
    }
}
