//! The lease record of one lock: its text form on disk, and the rules read from it.
//!
//! A record is a few `key value` lines, readable with `cat`:
//!
//! ```text
//! tenure-local-lease v1
//! boot 0c6e1f3a-5b2d-4c47-9d8e-3f1a2b4c5d6e
//! fencing 1767225600123456
//! grants 3
//! holder 00112233445566778899aabbccddeeff
//! expires 81234567890123
//! identity web-1-4242
//! acks 8899aabbccddeeff0011223344556677
//! next 81239567890123 web-2-77
//! end
//! ```
//!
//! - `boot`: the kernel's boot id when the record was written; `expires` is meaningful only
//!   within that boot.
//! - `fencing`: the highest token ever issued for this lock (the current or latest holder's).
//! - `grants`: how many terms were granted since the record was created.
//! - `holder`: the holder token (32 hex digits), or `-` when the lock was released.
//! - `expires`: `CLOCK_MONOTONIC` nanoseconds at which the holder's ttl runs out.
//! - `identity`: the holder's identity, with `\` and control characters escaped.
//! - `acks`: holder tokens of the latest releases (newest first), so a replayed release still
//!   reports success.
//! - `next` (optional): a hand-over in its window — `CLOCK_MONOTONIC` nanoseconds at which
//!   the window ends, then the preferred next holder's identity (escaped), or nothing for
//!   "anyone". Written by `release_to` and `request_handoff`, cleared by the next grant.
//! - `end`: the last line, so a truncated record is recognised as such.

use std::fmt::Write as _;

use crate::backend::{Handoff, HolderChange, HolderToken};

/// The first line of every record: the format and its version.
const MAGIC: &str = "tenure-local-lease v1";
/// At most this many release acks are kept per lock.
pub(super) const ACKS_KEPT: usize = 8;

/// The state of one lock.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Record {
    /// The boot id when this record was written.
    pub(super) boot: String,
    /// The highest fencing token issued for this lock.
    pub(super) fencing: u64,
    /// Terms granted since the record was created.
    pub(super) grants: u64,
    /// The holder, if the lock was not released (it may have expired).
    pub(super) holder: Option<Holder>,
    /// Holder tokens of the latest releases, newest first.
    pub(super) acks: Vec<HolderToken>,
    /// A hand-over and the `CLOCK_MONOTONIC` nanoseconds (of `boot`) at which its window ends.
    pub(super) handoff: Option<(Handoff, u64)>,
}

/// The holder of a lock, as recorded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Holder {
    pub(super) token: HolderToken,
    pub(super) identity: String,
    /// `CLOCK_MONOTONIC` nanoseconds (of the record's boot) at which the ttl runs out.
    pub(super) expires_ns: u64,
}

impl Record {
    /// The holder whose ttl has not run out at `now_ns` on the clock of boot `boot`.
    pub(super) fn live(&self, boot: &str, now_ns: u64) -> Option<&Holder> {
        self.holder
            .as_ref()
            .filter(|h| self.boot == boot && h.expires_ns > now_ns)
    }

    /// The record as an observer sees it at `now_ns`.
    pub(super) fn change(&self, boot: &str, now_ns: u64) -> HolderChange {
        self.live(boot, now_ns)
            .map_or_else(HolderChange::free, |h| HolderChange {
                holder: Some(h.identity.clone()),
                fencing: Some(crate::backend::FencingToken::new(self.fencing)),
            })
    }

    /// The hand-over whose window has not ended at `now_ns` on the clock of boot `boot`.
    pub(super) fn handoff(&self, boot: &str, now_ns: u64) -> Option<&Handoff> {
        self.handoff
            .as_ref()
            .filter(|(_, until)| self.boot == boot && *until > now_ns)
            .map(|(h, _)| h)
    }

    /// Remembers that `token` released, newest first.
    pub(super) fn ack(&mut self, token: HolderToken) {
        self.acks.insert(0, token);
        self.acks.truncate(ACKS_KEPT);
    }

    /// The text form.
    pub(super) fn encode(&self) -> String {
        let mut s = String::with_capacity(256);
        // Writing to a String cannot fail.
        let _ = writeln!(s, "{MAGIC}");
        let _ = writeln!(s, "boot {}", self.boot);
        let _ = writeln!(s, "fencing {}", self.fencing);
        let _ = writeln!(s, "grants {}", self.grants);
        match &self.holder {
            Some(h) => {
                let _ = writeln!(s, "holder {}", h.token.to_hex());
                let _ = writeln!(s, "expires {}", h.expires_ns);
                let _ = writeln!(s, "identity {}", escape(&h.identity));
            }
            None => {
                let _ = writeln!(s, "holder -");
            }
        }
        s.push_str("acks");
        for a in &self.acks {
            s.push(' ');
            s.push_str(&a.to_hex());
        }
        if let Some((handoff, until)) = &self.handoff {
            let _ = write!(s, "\nnext {until}");
            if let Some(to) = handoff.target() {
                let _ = write!(s, " {}", escape(to));
            }
        }
        s.push_str("\nend\n");
        s
    }

    /// Parses the text form; the error says what is wrong.
    pub(super) fn parse(text: &str) -> Result<Self, String> {
        let mut fields = Fields::open(text, MAGIC)?;
        let number = |key: &str, v: String| -> Result<u64, String> {
            v.parse()
                .map_err(|_| format!("`{key}` is not an unsigned integer: {v:?}"))
        };
        let boot = fields.boot()?;
        let fencing = number("fencing", fields.next("fencing")?)?;
        let grants = number("grants", fields.next("grants")?)?;
        let holder = match fields.next("holder")?.as_str() {
            "-" => None,
            hex => {
                let token = HolderToken::from_hex(hex)
                    .ok_or_else(|| format!("`holder` is not 32 hex digits: {hex:?}"))?;
                let expires_ns = number("expires", fields.next("expires")?)?;
                let identity = unescape(&fields.next("identity")?)?;
                Some(Holder {
                    token,
                    identity,
                    expires_ns,
                })
            }
        };
        let acks = fields
            .next("acks")?
            .split(' ')
            .filter(|a| !a.is_empty())
            .map(|a| HolderToken::from_hex(a).ok_or_else(|| format!("bad ack {a:?}")))
            .collect::<Result<Vec<_>, _>>()?;
        let handoff = match fields.optional("next") {
            None => None,
            Some(v) => {
                let (until, to) = v.split_once(' ').unwrap_or((&v, ""));
                let until = number("next", until.to_owned())?;
                let to = unescape(to)?;
                if to.len() > crate::backend::types::MAX_IDENTITY_LEN {
                    return Err("`next` names an identity longer than any identity".to_owned());
                }
                let handoff = if to.is_empty() {
                    Handoff::Anyone
                } else {
                    Handoff::To(to)
                };
                Some((handoff, until))
            }
        };
        fields.finish()?;
        Ok(Self {
            boot,
            fencing,
            grants,
            holder,
            acks,
            handoff,
        })
    }
}

/// The `key value` lines of a text record (a lease's, a group member's) between its magic first
/// line and its `end` line, read in order; the error says what is wrong.
pub(super) struct Fields<'a> {
    lines: std::str::Lines<'a>,
}

impl<'a> Fields<'a> {
    /// Checks the `end` trailer (a record cut short is refused) and the magic first line.
    pub(super) fn open(text: &'a str, magic: &str) -> Result<Self, String> {
        let body = text
            .strip_suffix("end\n")
            .ok_or("truncated: the last line is not `end`")?;
        let mut lines = body.lines();
        if lines.next() != Some(magic) {
            return Err(format!("the first line is not `{magic}`"));
        }
        Ok(Self { lines })
    }

    /// The value of the next line, which must be `key` (empty value) or `key value`.
    pub(super) fn next(&mut self, key: &str) -> Result<String, String> {
        let line = self
            .lines
            .next()
            .ok_or_else(|| format!("missing `{key}`"))?;
        let value = if line == key {
            ""
        } else {
            line.strip_prefix(key)
                .and_then(|r| r.strip_prefix(' '))
                .ok_or_else(|| format!("expected `{key}`, found {line:?}"))?
        };
        Ok(value.to_owned())
    }

    /// The value of the next line if it is `key value` (or `key`); otherwise nothing is
    /// consumed.
    pub(super) fn optional(&mut self, key: &str) -> Option<String> {
        let mut ahead = self.lines.clone();
        let line = ahead.next()?;
        let value = if line == key {
            ""
        } else {
            line.strip_prefix(key)?.strip_prefix(' ')?
        };
        self.lines = ahead;
        Some(value.to_owned())
    }

    /// The `boot` line: the boot id the record's monotonic instants belong to.
    pub(super) fn boot(&mut self) -> Result<String, String> {
        let boot = self.next("boot")?;
        if boot.is_empty() || boot.contains(char::is_whitespace) {
            return Err(format!("`boot` is malformed: {boot:?}"));
        }
        Ok(boot)
    }

    /// Refuses anything after the last field.
    pub(super) fn finish(mut self) -> Result<(), String> {
        match self.lines.next() {
            Some(extra) => Err(format!("unexpected line {extra:?}")),
            None => Ok(()),
        }
    }
}

/// `\` becomes `\\`, a control character `\uXXXX` (4 hex digits); everything else is kept.
pub(super) fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if c == '\\' {
            out.push_str("\\\\");
        } else if c.is_control() {
            let _ = write!(out, "\\u{:04x}", u32::from(c));
        } else {
            out.push(c);
        }
    }
    out
}

pub(super) fn unescape(s: &str) -> Result<String, String> {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('\\') => out.push('\\'),
            Some('u') => {
                let hex: String = chars.by_ref().take(4).collect();
                let c = u32::from_str_radix(&hex, 16)
                    .ok()
                    .and_then(char::from_u32)
                    .filter(|_| hex.len() == 4)
                    .ok_or_else(|| format!("`identity` has a bad escape \\u{hex}"))?;
                out.push(c);
            }
            _ => return Err("`identity` has a bad escape".to_owned()),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(holder: bool) -> Record {
        Record {
            boot: "0c6e1f3a-5b2d-4c47-9d8e-3f1a2b4c5d6e".into(),
            fencing: 1_767_225_600_123_456,
            grants: 3,
            holder: holder.then(|| Holder {
                token: HolderToken::random(),
                identity: "we\\ird\nname é".into(),
                expires_ns: 81_234_567_890_123,
            }),
            acks: vec![HolderToken::random(), HolderToken::random()],
            handoff: None,
        }
    }

    #[test]
    fn record_should_round_trip_a_handoff() {
        for handoff in [Handoff::Anyone, Handoff::To("we ird\\name\n".into())] {
            let mut r = sample(false);
            r.handoff = Some((handoff, 81_234_567_890_123));
            assert_eq!(Record::parse(&r.encode()), Ok(r.clone()));
            assert!(r.handoff(&r.boot, 81_234_567_890_122).is_some());
            assert!(r.handoff(&r.boot, 81_234_567_890_123).is_none());
            assert!(r.handoff("another-boot", 0).is_none());
        }
        let mut long = sample(false);
        long.handoff = Some((Handoff::To("a".repeat(300)), 1));
        let bad = long.encode();
        assert!(
            Record::parse(&bad).is_err(),
            "an oversized target is refused"
        );
    }

    #[test]
    fn record_should_round_trip_with_and_without_holder() {
        for held in [true, false] {
            let r = sample(held);
            let text = r.encode();
            assert_eq!(text.lines().count(), if held { 9 } else { 7 }, "{text}");
            assert_eq!(Record::parse(&text), Ok(r));
        }
        let mut none = sample(false);
        none.acks.clear();
        assert_eq!(Record::parse(&none.encode()), Ok(none));
    }

    #[test]
    fn record_should_reject_every_truncation_and_garbage() {
        let text = sample(true).encode();
        for cut in 0..text.len() {
            if text.is_char_boundary(cut) {
                assert!(Record::parse(&text[..cut]).is_err(), "accepted {cut} bytes");
            }
        }
        assert!(Record::parse("garbage\nend\n").is_err());
        let extra = text.replace("acks", "bogus 1\nacks");
        assert!(Record::parse(&extra).is_err());
        let bad_number = text.replace("grants 3", "grants -3");
        assert!(Record::parse(&bad_number).unwrap_err().contains("grants"));
    }

    #[test]
    fn record_should_keep_only_the_latest_acks() {
        let mut r = sample(false);
        let newest = HolderToken::random();
        for _ in 0..ACKS_KEPT {
            r.ack(HolderToken::random());
        }
        r.ack(newest);
        assert_eq!(r.acks.len(), ACKS_KEPT);
        assert_eq!(r.acks[0], newest);
    }

    #[test]
    fn record_should_be_live_only_in_its_boot_and_before_expiry() {
        let r = sample(true);
        assert!(r.live(&r.boot, 81_234_567_890_122).is_some());
        assert!(r.live(&r.boot, 81_234_567_890_123).is_none());
        assert!(r.live("another-boot", 0).is_none());
        assert!(r.change("another-boot", 0).is_free());
    }
}
