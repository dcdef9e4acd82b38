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

/// Runs `tests/contracts/requirements.txt`'s Python (`CHATPIPE_PYTHON`, the venv
/// scripts/test makes) with `args` at the repository's root; fails with its output
/// unless it succeeds.
pub fn run_python(args: &[&str]) -> String {
    let python = std::env::var("CHATPIPE_PYTHON").unwrap_or_else(|_| {
        panic!("CHATPIPE_PYTHON is not set: run the suite with scripts/test, which installs tests/contracts/requirements.txt")
    });
    run_tool(
        &python,
        args,
        &repo_root(),
        "pip install -r tests/contracts/requirements.txt (scripts/test does)",
    )
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
