//! Alert rules and the dashboard: valid for their tools, and every metric they read is
//! one a service exports (core/src/catalogue.rs), so a renamed metric cannot leave an
//! alert that never fires.

use std::collections::BTreeSet;

use chatpipe_core::catalogue::{reader_metrics, Kind, METRICS, READER_PREFIXES};

use crate::{repo_root, run_tool};

const PROMTOOL: &str = "install Debian's prometheus package for promtool (scripts/test does)";

#[test]
fn the_alert_rules_pass_promtool_and_their_unit_tests() {
    let dir = repo_root().join("docs/prometheus");
    for args in [
        ["check", "rules", "chatpipe.rules.yml"],
        ["test", "rules", "chatpipe.rules.test.yml"],
        ["check", "config", "prometheus.yml"],
    ] {
        let out = run_tool("promtool", &args, &dir, PROMTOOL);
        assert!(out.contains("SUCCESS"), "promtool {args:?}: {out}");
    }
}

#[test]
fn every_alert_has_a_severity_and_says_what_to_do() {
    let rules = rules();
    let mut alerts = 0;
    for group in rules["groups"].as_sequence().unwrap() {
        for rule in group["rules"].as_sequence().unwrap() {
            let Some(name) = rule["alert"].as_str() else {
                continue;
            };
            alerts += 1;
            let severity = rule["labels"]["severity"].as_str();
            assert!(
                matches!(severity, Some("critical" | "warning")),
                "{name}: severity {severity:?}"
            );
            for field in ["summary", "description"] {
                assert!(
                    rule["annotations"][field]
                        .as_str()
                        .is_some_and(|s| s.len() > 10),
                    "{name} has no {field}"
                );
            }
        }
    }
    assert!(alerts >= 10, "{alerts} alerts");
}

/// Every alert links its runbook, and `docs/runbooks.md` has exactly one section per
/// alert, in the rules' order, each saying what it means, what users see, what to check
/// and what to do.
#[test]
fn every_alert_has_a_runbook_section_and_links_it() {
    let rules = rules();
    let mut alerts = Vec::new();
    for group in rules["groups"].as_sequence().unwrap() {
        for rule in group["rules"].as_sequence().unwrap() {
            let Some(name) = rule["alert"].as_str() else {
                continue;
            };
            let url = rule["annotations"]["runbook_url"].as_str();
            let expected = format!("docs/runbooks.md#{}", name.to_lowercase());
            assert_eq!(url, Some(expected.as_str()), "{name}'s runbook_url");
            alerts.push(name.to_string());
        }
    }
    let runbooks = std::fs::read_to_string(repo_root().join("docs/runbooks.md")).unwrap();
    let sections: Vec<&str> = runbooks.split("\n## ").skip(1).collect();
    let names: Vec<String> = sections
        .iter()
        .map(|s| s.lines().next().unwrap_or("").trim().to_string())
        .collect();
    assert_eq!(
        names, alerts,
        "docs/runbooks.md's sections against the alerts"
    );
    for (name, section) in alerts.iter().zip(&sections) {
        let parts = [
            "**What it means.**",
            "**What users see.**",
            "**What to check.**",
            "**What to do.**",
        ];
        let at: Vec<Option<usize>> = parts.iter().map(|p| section.find(p)).collect();
        assert!(
            at.iter().all(Option::is_some) && at.windows(2).all(|w| w[0] < w[1]),
            "{name}'s runbook needs {parts:?} in that order: {at:?}"
        );
    }
}

#[test]
fn every_metric_the_rules_and_the_dashboard_read_is_one_a_service_exports() {
    let rules = rules();
    let mut exprs = Vec::new();
    let mut recorded = BTreeSet::new();
    for group in rules["groups"].as_sequence().unwrap() {
        for rule in group["rules"].as_sequence().unwrap() {
            exprs.push(rule["expr"].as_str().unwrap().to_owned());
            if let Some(record) = rule["record"].as_str() {
                recorded.insert(record.to_owned());
            }
        }
    }
    let dashboard: serde_json::Value = serde_json::from_slice(
        &std::fs::read(repo_root().join("docs/grafana/chatpipe.json")).unwrap(),
    )
    .expect("the dashboard is JSON");
    let mut panels = 0;
    for panel in dashboard["panels"].as_array().unwrap() {
        if panel["type"] == "row" {
            continue;
        }
        panels += 1;
        let targets = panel["targets"].as_array().expect("a panel has targets");
        assert!(
            !targets.is_empty(),
            "panel {} queries nothing",
            panel["title"]
        );
        exprs.extend(
            targets
                .iter()
                .map(|t| t["expr"].as_str().unwrap().to_owned()),
        );
    }
    assert!(panels >= 20, "{panels} panels");
    let covered = ["Ingest", "CDC", "Receipts", "Fanout", "Gateway"];
    let rows: Vec<&str> = dashboard["panels"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["type"] == "row")
        .filter_map(|p| p["title"].as_str())
        .collect();
    for area in covered {
        assert!(
            rows.iter().any(|r| r.starts_with(area)),
            "no dashboard row for {area}: {rows:?}"
        );
    }

    let exported = exported_series();
    let reader_suffixes: BTreeSet<String> = reader_metrics("")
        .into_iter()
        .map(|(name, _, _)| name)
        .collect();
    let mut unknown = Vec::new();
    for expr in &exprs {
        let (names, patterns) = metric_references(expr);
        for name in names {
            if !exported.contains(&name) && !recorded.contains(&name) && name != "up" {
                unknown.push(format!("{name} (in {expr})"));
            }
        }
        for suffix in patterns {
            if !reader_suffixes.contains(&suffix) {
                unknown.push(format!("*{suffix} (in {expr})"));
            }
        }
    }
    assert!(
        unknown.is_empty(),
        "not exported by any service: {unknown:#?}"
    );
}

fn rules() -> serde_yaml_ng::Value {
    serde_yaml_ng::from_slice(
        &std::fs::read(repo_root().join("docs/prometheus/chatpipe.rules.yml")).unwrap(),
    )
    .expect("the rules are YAML")
}

/// Every series name the services export: the catalogue and every reader's metrics, with a histogram's `_bucket`,
/// `_sum` and `_count`.
fn exported_series() -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let readers = READER_PREFIXES.iter().flat_map(|p| reader_metrics(p));
    let all = METRICS
        .iter()
        .map(|(name, kind, _)| (name.to_string(), *kind))
        .chain(readers.map(|(name, kind, _)| (name, kind)));
    for (name, kind) in all {
        names.insert(name.clone());
        if kind == Kind::Histogram {
            for suffix in ["_bucket", "_sum", "_count"] {
                names.insert(format!("{name}{suffix}"));
            }
        }
    }
    names
}

/// The metric names a PromQL expression reads, and the suffixes of its
/// `__name__=~".+<suffix>"` selectors (reader metrics, whatever their prefix).
fn metric_references(expr: &str) -> (Vec<String>, Vec<String>) {
    const WORDS: &[&str] = &[
        "by",
        "without",
        "on",
        "ignoring",
        "group_left",
        "group_right",
        "bool",
        "and",
        "or",
        "unless",
        "offset",
        "sum",
        "min",
        "max",
        "avg",
        "count",
        "group",
        "stddev",
        "stdvar",
        "topk",
        "bottomk",
        "quantile",
        "count_values",
    ];
    let mut names = Vec::new();
    let mut patterns = Vec::new();
    let chars: Vec<char> = expr.chars().collect();
    let mut i = 0;
    // Words inside `{…}`, `[…]`, quotes and the label list after by/without are not names.
    let mut after_grouping = false;
    while i < chars.len() {
        let c = chars[i];
        if c == '{' {
            let end = chars[i..].iter().position(|&c| c == '}').unwrap() + i;
            let selector: String = chars[i + 1..end].iter().collect();
            if let Some(rest) = selector.split("__name__=~\".+").nth(1) {
                patterns.push(rest.split('"').next().unwrap().to_owned());
            }
            i = end + 1;
        } else if c == '[' {
            i = chars[i..].iter().position(|&c| c == ']').unwrap() + i + 1;
        } else if c == '"' {
            i = chars[i + 1..].iter().position(|&c| c == '"').unwrap() + i + 2;
        } else if c == '(' && after_grouping {
            i = chars[i..].iter().position(|&c| c == ')').unwrap() + i + 1;
            after_grouping = false;
        } else if c.is_ascii_alphabetic() || c == '_' {
            let start = i;
            while i < chars.len() && (chars[i].is_ascii_alphanumeric() || "_:".contains(chars[i])) {
                i += 1;
            }
            let word: String = chars[start..i].iter().collect();
            let next = chars[i..].iter().find(|c| !c.is_whitespace());
            if word == "by" || word == "without" || word == "on" || word == "ignoring" {
                after_grouping = true;
            } else if next != Some(&'(') && !WORDS.contains(&word.as_str()) {
                names.push(word);
            }
        } else if c.is_ascii_digit() || c == '.' {
            while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '.') {
                i += 1;
            }
        } else {
            i += 1;
        }
    }
    (names, patterns)
}

#[test]
fn metric_references_finds_names_and_reader_patterns_and_skips_labels() {
    let (names, patterns) = metric_references(
        r#"sum by (job, le) (rate(gateway_push_latency_seconds_bucket{job="x"}[5m])) / on (job) up > 0.5
           or label_replace({__name__=~".+_consumer_stalled"}, "reader", "$1", "__name__", "(.+)")"#,
    );
    assert_eq!(names, ["gateway_push_latency_seconds_bucket", "up"]);
    assert_eq!(patterns, ["_consumer_stalled"]);
}

#[test]
fn every_metric_the_code_writes_is_in_the_catalogue() {
    let exported = exported_series();
    let mut missing = BTreeSet::new();
    let mut found = 0;
    for crate_dir in ["core", "ingest-api", "pipeline", "gateway", "schemas"] {
        for file in rust_files(&repo_root().join(crate_dir).join("src")) {
            let text = std::fs::read_to_string(&file).unwrap();
            for macro_name in ["counter!(", "gauge!(", "histogram!("] {
                for (at, _) in text.match_indices(macro_name) {
                    let rest = text[at + macro_name.len()..].trim_start();
                    // A literal name; names made at run time are the readers' (checked
                    // by READER_PREFIXES) or passed in from a literal elsewhere.
                    let Some(rest) = rest.strip_prefix('"') else {
                        continue;
                    };
                    let name = &rest[..rest.find('"').unwrap()];
                    found += 1;
                    if !exported.contains(name) {
                        missing.insert(format!("{name} ({})", file.display()));
                    }
                }
            }
        }
    }
    assert!(found > 50, "found only {found} metric names in the code");
    assert!(
        missing.is_empty(),
        "written by the code, missing from core/src/catalogue.rs: {missing:#?}"
    );
}

pub fn rust_files(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files.extend(rust_files(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            files.push(path);
        }
    }
    files
}
