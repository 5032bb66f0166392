//! The docs keep working: every relative link and `#anchor` in the README, the guides and the
//! other Markdown pages resolves (no network: links to other sites are not followed); the
//! shell snippets marked `sh test` (the ones that run on one host) run with the real `tenure`
//! binary and succeed; and the chart's values table documents exactly the values `values.yaml`
//! has, each of them also in `values.schema.json`. (The guides' Rust snippets are doc tests,
//! from `src/lib.rs`.)

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// The Markdown pages a reader follows links through.
fn pages() -> Vec<PathBuf> {
    let root = Path::new(ROOT);
    let mut out: Vec<PathBuf> = [
        "README.md",
        "ARCHITECTURE.md",
        "CHANGELOG.md",
        "charts/tenure/README.md",
        "e2e/kube-testenv/README.md",
        "e2e/node/README.md",
    ]
    .iter()
    .map(|p| root.join(p))
    .collect();
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .expect("docs/")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    out.extend(docs);
    out
}

/// The page's text outside fenced code blocks, line by line (code may look like links).
fn prose(text: &str) -> Vec<&str> {
    let mut fenced = false;
    text.lines()
        .filter(|l| {
            if l.trim_start().starts_with("```") {
                fenced = !fenced;
                return false;
            }
            !fenced
        })
        .collect()
}

/// `line` without its inline code spans.
fn without_code(line: &str) -> String {
    let mut out = String::new();
    let mut in_code = false;
    for c in line.chars() {
        if c == '`' {
            in_code = !in_code;
        } else if !in_code {
            out.push(c);
        }
    }
    out
}

/// The targets of the inline links `[text](target)` on `line`.
fn links(line: &str) -> Vec<String> {
    let line = without_code(line);
    let mut out = Vec::new();
    let mut rest = line.as_str();
    while let Some(i) = rest.find("](") {
        let after = &rest[i + 2..];
        let Some(end) = after.find(')') else { break };
        out.push(after[..end].trim().to_owned());
        rest = &after[end..];
    }
    out
}

/// GitHub's anchor for a heading: its text (inline code's too) lowercased, punctuation
/// dropped (letters, digits, `-`, `_` and spaces kept), spaces turned into `-`.
fn slug(heading: &str) -> String {
    heading
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, '-' | '_' | ' '))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// Every anchor a page defines (a repeated heading gets `-1`, `-2`…, as on GitHub).
fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut out = BTreeSet::new();
    for line in prose(text) {
        let Some(heading) = line.strip_prefix('#') else {
            continue;
        };
        let heading = heading.trim_start_matches('#');
        if !heading.starts_with(' ') {
            continue;
        }
        let base = slug(heading.trim());
        let n = seen.entry(base.clone()).or_insert(0);
        out.insert(if *n == 0 {
            base.clone()
        } else {
            format!("{base}-{n}")
        });
        *n += 1;
    }
    out
}

#[test]
fn every_relative_link_and_anchor_resolves() {
    let mut broken = Vec::new();
    let mut checked = 0;
    // Each linked page's anchors, read once.
    let mut anchors_of: BTreeMap<PathBuf, BTreeSet<String>> = BTreeMap::new();
    for page in pages() {
        let text = std::fs::read_to_string(&page).unwrap_or_else(|e| panic!("{page:?}: {e}"));
        let dir = page.parent().expect("a directory");
        for (n, line) in prose(&text).into_iter().enumerate() {
            for target in links(line) {
                if target.contains("://") || target.starts_with("mailto:") {
                    continue;
                }
                checked += 1;
                let (path, anchor) = match target.split_once('#') {
                    Some((p, a)) => (p, Some(a)),
                    None => (target.as_str(), None),
                };
                let file = if path.is_empty() {
                    page.clone()
                } else {
                    dir.join(path)
                };
                let where_ = format!("{}: prose line {}: ({target})", page.display(), n + 1);
                if !file.exists() {
                    broken.push(format!("{where_}: no such file"));
                    continue;
                }
                if let Some(anchor) = anchor {
                    let known = anchors_of.entry(file.clone()).or_insert_with(|| {
                        anchors(&std::fs::read_to_string(&file).unwrap_or_default())
                    });
                    if !known.contains(anchor) {
                        broken.push(format!("{where_}: no heading with that anchor"));
                    }
                }
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
    assert!(
        checked > 30,
        "only {checked} links found: the parser is broken"
    );
}

#[test]
fn anchors_follow_github() {
    assert_eq!(slug("Known gaps"), "known-gaps");
    assert_eq!(
        slug("Checking from outside: `tenure policy --check`"),
        "checking-from-outside-tenure-policy---check"
    );
    assert_eq!(
        slug("Write an operator: `Locker`, `LeaderElector` and `Cache`"),
        "write-an-operator-locker-leaderelector-and-cache"
    );
    assert_eq!(
        slug("What a lease guarantees, and what it does not"),
        "what-a-lease-guarantees-and-what-it-does-not"
    );
    let a = anchors("# A\n## B c\n```\n# not a heading\n```\n## B c\n");
    assert_eq!(a, ["a", "b-c", "b-c-1"].map(String::from).into());
    assert_eq!(
        links("see [x](a.md#b) and `[y](no.md)` and [z](https://e.org)"),
        ["a.md#b", "https://e.org"]
    );
}

/// The shell snippets fenced as ```` ```sh test ````, with their page.
fn tested_snippets() -> Vec<(PathBuf, String)> {
    let mut out = Vec::new();
    for page in pages() {
        let text = std::fs::read_to_string(&page).expect("page");
        let mut current: Option<String> = None;
        for line in text.lines() {
            match &mut current {
                None if line.trim() == "```sh test" => current = Some(String::new()),
                Some(body) if line.trim() == "```" => {
                    out.push((page.clone(), std::mem::take(body)));
                    current = None;
                }
                Some(body) => {
                    body.push_str(line);
                    body.push('\n');
                }
                None => {}
            }
        }
    }
    out
}

/// Each `sh test` snippet runs under `bash -e` in a fresh directory, with the `tenure` under
/// test first on `PATH` and its own local-backend state directory, and succeeds within a
/// minute.
#[test]
fn one_host_shell_snippets_run() {
    let snippets = tested_snippets();
    assert!(snippets.len() >= 3, "{snippets:?}");
    let bin = Path::new(env!("CARGO_BIN_EXE_tenure"))
        .parent()
        .expect("the binary's directory")
        .to_owned();
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    for (i, (page, body)) in snippets.iter().enumerate() {
        let dir = std::env::temp_dir().join(format!("tenure-docs-{}-{i}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("a scratch directory");
        let started = Instant::now();
        let mut child = std::process::Command::new("bash")
            .args(["-e", "-c", body])
            .current_dir(&dir)
            .env("PATH", &path)
            .env("TENURE_STATE_DIR", dir.join("state"))
            .env_remove("TENURE_BACKEND")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("bash");
        loop {
            if child.try_wait().expect("wait").is_some() {
                break;
            }
            if started.elapsed() > Duration::from_secs(60) {
                let _ = child.kill();
                panic!("{}: snippet {i} ran over a minute:\n{body}", page.display());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let out = child.wait_with_output().expect("output");
        assert!(
            out.status.success(),
            "{}: snippet failed ({}):\n{body}\nstdout:\n{}\nstderr:\n{}",
            page.display(),
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// Every key path of `value` (maps only: a list or a scalar is one value).
fn key_paths(value: &serde_json::Value, prefix: &str, out: &mut BTreeSet<String>) {
    if let serde_json::Value::Object(map) = value {
        for (k, v) in map {
            let path = if prefix.is_empty() {
                k.clone()
            } else {
                format!("{prefix}.{k}")
            };
            out.insert(path.clone());
            key_paths(v, &path, out);
        }
    }
}

/// Whether the schema declares `path` (through `properties`).
fn in_schema(schema: &serde_json::Value, path: &str) -> bool {
    let mut node = schema;
    for key in path.split('.') {
        match node.get("properties").and_then(|p| p.get(key)) {
            Some(next) => node = next,
            None => return false,
        }
    }
    true
}

#[test]
fn the_chart_values_table_matches_values_and_schema() {
    let chart = Path::new(ROOT).join("charts/tenure");
    let readme = std::fs::read_to_string(chart.join("README.md")).expect("chart README");
    let values: serde_json::Value = serde_saphyr::from_str(
        &std::fs::read_to_string(chart.join("values.yaml")).expect("values.yaml"),
    )
    .expect("values.yaml parses");
    let schema: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(chart.join("values.schema.json")).expect("schema"),
    )
    .expect("the schema parses");
    // The rows of the table under "## Values": one value per row, named in the first cell.
    let section = readme
        .split("\n## ")
        .find(|s| s.starts_with("Values"))
        .expect("a Values section");
    let documented: Vec<String> = section
        .lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .map(|l| l.split('`').next().unwrap_or_default().to_owned())
        .collect();
    assert!(documented.len() > 50, "{documented:?}");
    let mut keys = BTreeSet::new();
    key_paths(&values, "", &mut keys);
    let mut problems = Vec::new();
    let mut seen = BTreeSet::new();
    for name in &documented {
        if !seen.insert(name) {
            problems.push(format!("`{name}` is documented twice"));
        }
        if !keys.contains(name) {
            problems.push(format!("`{name}` is documented but not in values.yaml"));
        }
        if !in_schema(&schema, name) {
            problems.push(format!(
                "`{name}` is documented but not in values.schema.json"
            ));
        }
    }
    // A value is documented by its own row or by a row for a map holding it.
    for key in &keys {
        let covered = documented
            .iter()
            .any(|d| key == d || key.starts_with(&format!("{d}.")))
            || documented.iter().any(|d| d.starts_with(&format!("{key}.")));
        if !covered {
            problems.push(format!(
                "`{key}` is in values.yaml but not in the chart README's table"
            ));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}
