//! The printed figures: milliseconds as text, Markdown tables.

/// `v` milliseconds as text: `2.51 s` from a second up; below, `21.3 ms` with `from_10`
/// decimals from 10 ms and `under_10` decimals under 10 ms (each bench keeps its own).
pub fn fmt_ms(v: f64, from_10: usize, under_10: usize) -> String {
    if v.abs() >= 1000.0 {
        format!("{:.2} s", v / 1000.0)
    } else if v.abs() >= 10.0 {
        format!("{v:.from_10$} ms")
    } else {
        format!("{v:.under_10$} ms")
    }
}

/// A Markdown table's header and rule: `| a | b | c |` and `|---|---|---:|`, the last
/// `right_aligned` columns aligned right.
pub fn header(columns: &[&str], right_aligned: usize) -> String {
    let left = columns.len().saturating_sub(right_aligned);
    let rule: String = (0..columns.len())
        .map(|i| if i < left { "---|" } else { "---:|" })
        .collect();
    format!("{}\n|{rule}", row(columns))
}

/// A Markdown table's row: `| a | b | c |`.
pub fn row<S: AsRef<str>>(cells: &[S]) -> String {
    let cells: Vec<&str> = cells.iter().map(AsRef::as_ref).collect();
    format!("| {} |", cells.join(" | "))
}

/// `15 s`, `0.5 s`.
pub fn secs(d: std::time::Duration) -> String {
    format!("{} s", d.as_secs_f64())
}

/// `lease 15 s / renew deadline 10 s / retry 2 s`: an election's durations.
pub fn durations(
    lease: std::time::Duration,
    renew_deadline: std::time::Duration,
    retry: std::time::Duration,
) -> String {
    format!(
        "lease {} / renew deadline {} / retry {}",
        secs(lease),
        secs(renew_deadline),
        secs(retry)
    )
}
