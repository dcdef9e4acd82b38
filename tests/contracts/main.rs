//! The contracts chatpipe publishes beside its code, checked against the code: the
//! OpenAPI document of the REST API, the Prometheus rules and the Grafana dashboard
//! (docs/prometheus, docs/grafana). Tools they
//! need (promtool) are installed by scripts/test; a missing one fails the test and says
//! which.

mod asyncapi;
mod compose;
mod dependencies;
mod openapi;
mod operations;

use std::path::PathBuf;

pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_owned()
}

/// Runs `program args` in `dir`; fails with its output unless it succeeds.
pub fn run_tool(program: &str, args: &[&str], dir: &std::path::Path, install: &str) -> String {
    let out = std::process::Command::new(program)
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap_or_else(|e| panic!("{program} could not run ({e}): {install}"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{program} {args:?} failed:\n{text}");
    text
}
