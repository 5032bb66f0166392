//! Duration strings as Kubernetes writes them (`15s`, `1m30s`, `500ms`): one parser for the
//! `Election` resource's fields and the `tenure` command's flags.

use std::time::Duration;

use kube::core::Duration as KubeDuration;

/// The grammar [`parse_duration`] accepts, as a regular expression for schemas: `0`, or one
/// or more of a decimal number (digits, optionally `.` and more digits) followed by a unit.
///
/// The Election CRD's duration fields and the Helm chart's `values.schema.json` use this same
/// pattern, so that a value one of them takes, the others take too.
pub const DURATION_PATTERN: &str = r"^(0|([0-9]+(\.[0-9]+)?(ns|us|µs|μs|ms|s|m|h))+)$";

/// The longest duration Go can represent (`time.Duration` is an `int64` of nanoseconds),
/// about 292 years.
const MAX_NANOS: u128 = 9_223_372_036_854_775_807;

/// The units and their length in nanoseconds (`µs` is U+00B5, `μs` U+03BC; Go takes both).
const UNITS: [(&str, u128); 8] = [
    ("ns", 1),
    ("us", 1_000),
    ("µs", 1_000),
    ("μs", 1_000),
    ("ms", 1_000_000),
    ("s", 1_000_000_000),
    ("m", 60_000_000_000),
    ("h", 3_600_000_000_000),
];

/// Why [`parse_duration`] refused a string. Every message names the string.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DurationError {
    /// The string is empty.
    #[error("empty duration: write a number and a unit, e.g. 15s, 1m30s or 500ms")]
    Empty,
    /// The string starts with `-`: Go reads a negative duration, which no timing here can be.
    #[error("{value:?} is negative: a duration must be 0 or more")]
    Negative {
        /// The string as given.
        value: String,
    },
    /// A number without a unit after it (only `0` may stand alone).
    #[error(
        "{value:?} has no unit after its last number: write e.g. {value}s (units: ns, us, ms, s, m, h)"
    )]
    NoUnit {
        /// The string as given.
        value: String,
    },
    /// A unit that is not one of `ns`, `us` (`µs`), `ms`, `s`, `m` and `h`.
    #[error("{value:?}: unknown unit {unit:?} (use ns, us, ms, s, m or h)")]
    UnknownUnit {
        /// The string as given.
        value: String,
        /// The unit found.
        unit: String,
    },
    /// Not a duration at all (a sign other than a leading `-`, a number without digits
    /// before its `.`, spaces, other characters).
    #[error(
        "{value:?} is not a duration: write numbers with units, e.g. 15s, 1m30s, 1.5h or 500ms"
    )]
    Invalid {
        /// The string as given.
        value: String,
    },
    /// Longer than Go's `time.Duration` can hold.
    #[error(
        "{value:?} is too long: at most 2562047h47m16.854775807s (Go's limit, about 292 years)"
    )]
    TooLong {
        /// The string as given.
        value: String,
    },
}

/// Parses a duration in Go's `time.ParseDuration` syntax, as `metav1.Duration`, kubectl and
/// client-go's flags write it: `15s`, `1m30s`, `1h2m3.5s`, `500ms`, `1.5h`, `0`.
///
/// The accepted strings are exactly those matching [`DURATION_PATTERN`], a subset of Go's
/// syntax: one or more numbers, each followed by its unit (`ns`, `us` or `µs`, `ms`, `s`,
/// `m`, `h`; components may repeat and come in any order, as in Go), or `0` alone — Go
/// accepts `0` without a unit, and so does this function, while `15` is refused rather than
/// guessed. Refused, with an error naming the string: the empty string, negative durations
/// (`-1s`, also `-0`), a `+` sign, numbers written `.5s` or `5.s` (Go takes them; the
/// Election CRD's schema does not), spaces, and anything longer than Go's limit of
/// 2562047h47m16.854775807s.
///
/// The value is computed by `kube::core::Duration`'s parser, the one the `Election`'s fields
/// are read with. That parser alone is not enough: it reads `""` as zero, ignores a trailing
/// `0` (`1s0`), and panics on a component that overflows or carries a sign of its own
/// (`1s-1s`), so the grammar is checked here first.
///
/// # Errors
///
/// [`DurationError`] saying what is wrong with the string.
///
/// # Example
///
/// ```
/// use std::time::Duration;
/// use tenure::crd::parse_duration;
///
/// assert_eq!(parse_duration("1m30s"), Ok(Duration::from_secs(90)));
/// assert_eq!(parse_duration("0"), Ok(Duration::ZERO));
/// assert!(parse_duration("-1s").is_err());
/// assert!(parse_duration("15").is_err());
/// ```
pub fn parse_duration(s: &str) -> Result<Duration, DurationError> {
    let value = || s.to_owned();
    if s.is_empty() {
        return Err(DurationError::Empty);
    }
    if let Some(magnitude) = s.strip_prefix('-') {
        // Negative only if what follows the sign is a duration; `-x` is just not one.
        return Err(match parse_duration(magnitude) {
            Ok(_) => DurationError::Negative { value: value() },
            Err(DurationError::TooLong { .. }) => DurationError::TooLong { value: value() },
            Err(_) => DurationError::Invalid { value: value() },
        });
    }
    if s == "0" {
        return Ok(Duration::ZERO);
    }
    // Each component: digits, optionally `.` and digits, then a unit.
    let mut total: u128 = 0;
    let mut rest = s;
    while !rest.is_empty() {
        let int_len = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        if int_len == 0 {
            return Err(DurationError::Invalid { value: value() });
        }
        let (int, after) = rest.split_at(int_len);
        let (frac, after) = match after.strip_prefix('.') {
            Some(after) => {
                let len = after
                    .find(|c: char| !c.is_ascii_digit())
                    .unwrap_or(after.len());
                if len == 0 {
                    return Err(DurationError::Invalid { value: value() });
                }
                after.split_at(len)
            }
            None => ("", after),
        };
        let unit_len = after
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(after.len());
        if unit_len == 0 {
            return Err(DurationError::NoUnit { value: value() });
        }
        let (unit, after) = after.split_at(unit_len);
        let Some(&(_, nanos)) = UNITS.iter().find(|(name, _)| *name == unit) else {
            // Whatever is not a letter (a sign, a space) is not a unit gone wrong.
            return Err(if unit.chars().all(char::is_alphabetic) {
                DurationError::UnknownUnit {
                    value: value(),
                    unit: unit.to_owned(),
                }
            } else {
                DurationError::Invalid { value: value() }
            });
        };
        total = total.saturating_add(component_nanos(int, frac, nanos));
        if total > MAX_NANOS {
            return Err(DurationError::TooLong { value: value() });
        }
        rest = after;
    }
    // The grammar holds and the total is in range, so kube's parser neither panics nor
    // reads anything differently; its error cannot happen, but is mapped all the same.
    match s.parse::<KubeDuration>() {
        Ok(d) if !d.is_negative() => Ok(d.into()),
        _ => Err(DurationError::Invalid { value: value() }),
    }
}

/// The nanoseconds of one component (`int.frac` units of `unit_nanos` each), saturating and
/// rounded down: precise enough to decide whether the total exceeds Go's limit.
fn component_nanos(int: &str, frac: &str, unit_nanos: u128) -> u128 {
    let int = int.trim_start_matches('0');
    // 39 digits may overflow u128 even before the multiplication; far past the limit anyway.
    let whole = match int.len() {
        0 => 0,
        1..=38 => int.parse::<u128>().unwrap_or(u128::MAX),
        _ => u128::MAX,
    };
    // The first 18 digits of the fraction, as a fraction of 10^18.
    let digits = &frac[..frac.len().min(18)];
    let part = digits.parse::<u128>().unwrap_or(0) * 10u128.pow(18 - digits.len() as u32);
    whole
        .saturating_mul(unit_nanos)
        .saturating_add(part * unit_nanos / 1_000_000_000_000_000_000)
}

/// Serde `deserialize_with` for the `Election`'s optional duration fields: absent or null is
/// `None`, a string goes through [`parse_duration`].
pub(crate) fn deserialize_optional<'de, D>(
    deserializer: D,
) -> Result<Option<KubeDuration>, D::Error>
where
    D: serde::Deserializer<'de>,
{
    use serde::Deserialize as _;
    use serde::de::Error as _;

    Option::<String>::deserialize(deserializer)?
        .map(|s| {
            parse_duration(&s)
                .map(KubeDuration::from)
                .map_err(D::Error::custom)
        })
        .transpose()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(s: &str) -> Duration {
        parse_duration(s).unwrap_or_else(|e| panic!("{s:?}: {e}"))
    }

    #[test]
    fn single_units_parse() {
        assert_eq!(ok("500ms"), Duration::from_millis(500));
        assert_eq!(ok("15s"), Duration::from_secs(15));
        assert_eq!(ok("90s"), Duration::from_secs(90));
        assert_eq!(ok("1.5s"), Duration::from_millis(1500));
        assert_eq!(ok("2m"), Duration::from_secs(120));
        assert_eq!(ok("1h"), Duration::from_secs(3600));
        assert_eq!(ok("1.5h"), Duration::from_secs(5400));
        assert_eq!(ok("300ms"), Duration::from_millis(300));
        assert_eq!(ok("10ns"), Duration::from_nanos(10));
        assert_eq!(ok("11us"), Duration::from_micros(11));
        assert_eq!(ok("12µs"), Duration::from_micros(12));
        assert_eq!(ok("12μs"), Duration::from_micros(12));
        // Leading zeros are decimal, as in Go (never octal).
        assert_eq!(ok("015s"), Duration::from_secs(15));
        assert_eq!(ok("0"), Duration::ZERO);
        assert_eq!(ok("0s"), Duration::ZERO);
    }

    #[test]
    fn compound_durations_parse() {
        assert_eq!(ok("1m30s"), Duration::from_secs(90));
        assert_eq!(ok("1h2m3.5s"), Duration::from_millis(3_723_500));
        assert_eq!(ok("1m29.5s"), Duration::from_millis(89_500));
        assert_eq!(
            ok("1h2m3s4ms5us6ns"),
            Duration::from_nanos(3_723_004_005_006)
        );
        // Go allows any order and repeated units.
        assert_eq!(ok("30s1m"), Duration::from_secs(90));
        assert_eq!(ok("1s1s"), Duration::from_secs(2));
    }

    #[test]
    fn bad_strings_are_refused_naming_the_value() {
        assert_eq!(parse_duration(""), Err(DurationError::Empty));
        for (s, needle) in [
            ("-1s", "is negative"),
            ("-0", "is negative"),
            ("-1m30s", "is negative"),
            ("-", "is not a duration"),
            ("--1s", "is not a duration"),
            ("-x", "is not a duration"),
            ("15", "has no unit"),
            ("1m30", "has no unit"),
            ("1.5", "has no unit"),
            ("15d", "unknown unit \"d\""),
            ("1m30sec", "unknown unit \"sec\""),
            ("1e3s", "unknown unit \"e\""),
            ("s", "is not a duration"),
            ("abc", "is not a duration"),
            ("+5s", "is not a duration"),
            (".5s", "is not a duration"),
            ("5.s", "is not a duration"),
            ("1..5s", "is not a duration"),
            (" 15s", "is not a duration"),
            ("15s ", "is not a duration"),
            ("15 s", "is not a duration"),
            ("1s-1s", "is not a duration"),
            ("1s+1s", "is not a duration"),
            ("1s0", "has no unit"),
            ("00", "has no unit"),
        ] {
            let err = parse_duration(s).expect_err(s).to_string();
            assert!(err.contains(needle), "{s:?}: {err}");
            assert!(err.contains(&format!("{s:?}")), "{s:?}: {err}");
        }
    }

    #[test]
    fn go_s_limit_holds_and_overflow_is_refused() {
        assert_eq!(
            ok("2562047h47m16.854775807s"),
            Duration::from_nanos(9_223_372_036_854_775_807)
        );
        for s in [
            "2562048h",
            "9223372036854775808ns",
            "2562047h47m16.854775808s",
            "99999999999999999999h",
            &format!("{}h", "9".repeat(400)),
            &"2562047h".repeat(2),
        ] {
            let err = parse_duration(s).expect_err(s);
            assert!(matches!(err, DurationError::TooLong { .. }), "{s}: {err}");
        }
    }

    #[test]
    fn the_election_s_fields_are_read_through_the_same_parser() {
        let read = |v: serde_json::Value| {
            serde_json::from_value::<super::super::ElectionSpec>(v).map(|s| s.lease_duration)
        };
        let spec = |d: serde_json::Value| serde_json::json!({"lease": "l", "backend": {"type": "Memory"}, "leaseDuration": d});
        let read_ok = read(spec("1m30s".into())).map(|d| d.map(Duration::from));
        assert_eq!(read_ok.ok(), Some(Some(Duration::from_secs(90))));
        assert_eq!(
            read(spec(serde_json::Value::Null)).ok(),
            Some(None),
            "null is absent"
        );
        let absent = serde_json::json!({"lease": "l", "backend": {"type": "Memory"}});
        assert_eq!(read(absent).ok(), Some(None));
        for bad in ["-1s", "1s-1s", "99999999999999999999h", ""] {
            let err = read(spec(bad.into())).expect_err(bad).to_string();
            assert!(err.contains(&format!("{bad:?}")) || bad.is_empty(), "{err}");
        }
    }
}
