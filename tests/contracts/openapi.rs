//! The OpenAPI document (`GET /openapi.json`) of a real ingest-api: valid OpenAPI 3.1 by
//! an independent validator, every operation in it served, every other method on its
//! paths refused, and every problem type of the API named in it.

use std::collections::BTreeSet;

use chatpipe_tests::{spawn_app_with, TestApp};
use serde_json::Value;

use crate::repo_root;

async fn document(app: &TestApp) -> Value {
    let res = app
        .http
        .get(format!("{}/openapi.json", app.base))
        .send()
        .await
        .expect("GET /openapi.json");
    assert_eq!(res.status(), 200);
    res.json().await.expect("the document is JSON")
}

#[tokio::test]
async fn the_document_is_valid_openapi_3_1() {
    let app = spawn_app_with(|s| s.demo.enabled = true).await;
    let doc = document(&app).await;
    assert_eq!(doc["openapi"], "3.1.0");
    let file = std::env::temp_dir().join(format!("chatpipe-openapi-{}.json", std::process::id()));
    std::fs::write(&file, serde_json::to_vec_pretty(&doc).unwrap()).unwrap();
    let out = crate::run_python(&["-m", "openapi_spec_validator", file.to_str().unwrap()]);
    assert!(out.contains("OK"), "{out}");
}

/// A request for each operation of the document, with every method on its path: the
/// documented ones are routed (whatever they answer, it is not "no such route" or 405),
/// the others are refused with 405.
#[tokio::test]
async fn every_documented_operation_is_served_and_no_other_method_on_its_path() {
    let app = spawn_app_with(|s| s.demo.enabled = true).await;
    let doc = document(&app).await;
    let token = app.token(10);
    let paths = doc["paths"].as_object().unwrap();
    assert!(paths.len() >= 15, "{} paths", paths.len());
    let mut checked = 0;
    for (template, operations) in paths {
        let path = template
            .replace("{id}", "1")
            .replace("{seq}", "1")
            .replace("{userId}", "2")
            .replace("{file}", "app.js");
        for method in ["get", "post", "patch", "delete", "put"] {
            let documented = operations.get(method).is_some();
            let res = app
                .http
                .request(
                    method.to_uppercase().parse().unwrap(),
                    format!("{}{path}", app.base),
                )
                .header("authorization", format!("Bearer {token}"))
                .header("content-type", "application/json")
                .body("{}")
                .send()
                .await
                .unwrap();
            let status = res.status().as_u16();
            let body: Value = res.json().await.unwrap_or(Value::Null);
            if documented {
                assert!(
                    status != 405 && status < 500 && body["detail"] != "no such route",
                    "{} {template} is documented but not served (or failed): {status} {body}",
                    method.to_uppercase()
                );
                checked += 1;
            } else {
                assert_eq!(
                    status,
                    405,
                    "{} {template} is not documented, yet answers {status} {body}",
                    method.to_uppercase()
                );
                assert_eq!(body["type"], "/problems/method-not-allowed");
            }
        }
    }
    assert!(checked >= 20, "{checked} operations called");
}

#[tokio::test]
async fn every_operation_says_its_answers_and_every_problem_type_is_named() {
    let app = spawn_app_with(|s| s.demo.enabled = true).await;
    let doc = document(&app).await;
    for (template, operations) in doc["paths"].as_object().unwrap() {
        for (method, op) in operations.as_object().unwrap() {
            let responses = op["responses"].as_object().unwrap();
            assert!(
                responses
                    .keys()
                    .any(|s| s.starts_with('2') || s.starts_with('3')),
                "{method} {template} documents no success"
            );
            assert!(
                op["summary"].as_str().is_some_and(|s| !s.is_empty()),
                "{method} {template} has no summary"
            );
            let secured = op.get("security") != Some(&serde_json::json!([{}]));
            if secured {
                assert!(responses.contains_key("401"), "{method} {template}: no 401");
            }
        }
    }
    // The problem types: those docs/api.md lists, and those the code writes.
    let text = doc.to_string();
    let mut codes: BTreeSet<String> = BTreeSet::new();
    let api_md = std::fs::read_to_string(repo_root().join("docs/api.md")).unwrap();
    codes.extend(problem_codes(&api_md, "/problems/"));
    for dir in ["ingest-api/src", "core/src"] {
        for file in crate::operations::rust_files(&repo_root().join(dir)) {
            let source = std::fs::read_to_string(&file).unwrap();
            for marker in ["code: \"", "conflict(\n", "conflict(\""] {
                codes.extend(problem_codes(&source, marker));
            }
            let mut rest = source.as_str();
            while let Some(at) = rest.find("Problem::new(") {
                rest = &rest[at + 13..];
                // The second argument: the code.
                if let Some(code) = rest.split(',').nth(1).map(str::trim) {
                    if let Some(code) = code.strip_prefix('"').and_then(|c| c.strip_suffix('"')) {
                        codes.insert(code.to_owned());
                    }
                }
            }
        }
    }
    assert!(codes.len() >= 18, "{codes:?}");
    let missing: Vec<&String> = codes
        .iter()
        .filter(|c| !text.contains(&format!("/problems/{c}")))
        .collect();
    assert!(
        missing.is_empty(),
        "problem types not named in /openapi.json: {missing:?}"
    );
}

/// The kebab-case codes right after each `marker` in `text` (skipping whitespace and a
/// quote).
fn problem_codes(text: &str, marker: &str) -> Vec<String> {
    text.match_indices(marker)
        .filter_map(|(at, _)| {
            let rest = text[at + marker.len()..]
                .trim_start()
                .trim_start_matches('"');
            let code: String = rest
                .chars()
                .take_while(|c| c.is_ascii_lowercase() || *c == '-')
                .collect();
            (code.len() > 2 && !code.ends_with('-')).then_some(code)
        })
        .collect()
}

/// The API's routes are registered only through utoipa-axum's `routes!` (which takes
/// path and method from the handler's `#[utoipa::path]`), so none is served without
/// its operation in the document. A plain `.route(` would escape that; only the admin
/// listener (operators' `/metrics`, not part of the API) uses one.
#[test]
fn no_api_route_is_registered_around_the_document() {
    let mut plain = Vec::new();
    for file in crate::operations::rust_files(&repo_root().join("ingest-api/src/routes")) {
        let source = std::fs::read_to_string(&file).unwrap();
        let api_part = match source.find("pub fn admin_router") {
            Some(at) => {
                // The admin router runs to the next item.
                let end = source[at..].find("\n}\n").map_or(source.len(), |e| at + e);
                format!("{}{}", &source[..at], &source[end..])
            }
            None => source,
        };
        for (at, _) in api_part.match_indices(".route(") {
            let line = api_part[..at].lines().count() + 1;
            plain.push(format!("{}:{line}", file.display()));
        }
    }
    assert!(
        plain.is_empty(),
        "routes registered without routes!(): {plain:?}"
    );
}

/// `docs/openapi.json` is the document a real ingest-api serves (without the demo's
/// routes, which are not part of the contract): a change to the API shows in review as a
/// change of that file. `CHATPIPE_BLESS_OPENAPI=1` writes it from the server.
#[tokio::test]
async fn the_committed_document_is_the_one_served() {
    let app = chatpipe_tests::spawn_app().await;
    let served = document(&app).await;
    let path = repo_root().join("docs/openapi.json");
    if std::env::var_os("CHATPIPE_BLESS_OPENAPI").is_some() {
        let text = serde_json::to_string_pretty(&served).unwrap() + "\n";
        std::fs::write(&path, text).unwrap();
    }
    let committed: Value =
        serde_json::from_slice(&std::fs::read(&path).unwrap()).expect("docs/openapi.json is JSON");
    assert!(
        committed == served,
        "docs/openapi.json is not what ingest-api serves: run \
         CHATPIPE_BLESS_OPENAPI=1 cargo test -p chatpipe-tests --test contracts \
         the_committed_document, review the diff, and note the change in CHANGELOG.md"
    );
}

const OASDIFF: &str = "scripts/test builds oasdiff into .stack/bin (go install \
     github.com/oasdiff/oasdiff@v1.39.0) and sets CHATPIPE_OASDIFF";

/// The newest released document of this major version (`docs/openapi/releases/`,
/// named by release).
fn last_released() -> std::path::PathBuf {
    let dir = repo_root().join("docs/openapi/releases");
    let mut releases: Vec<(Vec<u64>, std::path::PathBuf)> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter_map(|p| {
            let version = p.file_stem()?.to_str()?.to_owned();
            let parts = version
                .split('.')
                .map(|n| n.parse().ok())
                .collect::<Option<_>>()?;
            Some((parts, p))
        })
        .collect();
    releases.sort();
    releases.pop().expect("a released document").1
}

fn oasdiff_breaking(base: &std::path::Path, revision: &std::path::Path) -> std::process::Output {
    let program = std::env::var("CHATPIPE_OASDIFF").unwrap_or_else(|_| "oasdiff".into());
    std::process::Command::new(&program)
        .args(["breaking", "--fail-on", "ERR"])
        .arg(base)
        .arg(revision)
        .output()
        .unwrap_or_else(|e| panic!("{program} could not run ({e}): {OASDIFF}"))
}

/// Nothing in `docs/openapi.json` breaks a client of the last released document
/// (oasdiff's breaking-change rules at level ERR: a path, operation, response field or
/// enum value removed, a new required request field, a narrower type, …). And the check
/// bites: the same document with a path taken away and a request field made required
/// fails it.
#[test]
fn the_document_breaks_no_client_of_the_last_release() {
    let released = last_released();
    let current = repo_root().join("docs/openapi.json");
    let out = oasdiff_breaking(&released, &current);
    assert!(
        out.status.success(),
        "docs/openapi.json breaks clients of {}: a breaking change needs a new major \
         version (CHANGELOG.md):\n{}{}",
        released.display(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );

    let mut broken: Value = serde_json::from_slice(&std::fs::read(&current).unwrap()).unwrap();
    let paths = broken["paths"].as_object_mut().unwrap();
    assert!(
        paths.remove("/v1/blocks").is_some(),
        "the document has /v1/blocks"
    );
    let send = &mut broken["components"]["schemas"]["SendMessage"];
    send["required"]
        .as_array_mut()
        .expect("SendMessage lists its required fields")
        .push("mentions".into());
    let file = std::env::temp_dir().join(format!("chatpipe-broken-{}.json", std::process::id()));
    std::fs::write(&file, serde_json::to_vec(&broken).unwrap()).unwrap();
    let out = oasdiff_breaking(&current, &file);
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        !out.status.success(),
        "oasdiff let a breaking change pass: {text}"
    );
    assert!(
        text.contains("/v1/blocks") && text.contains("mentions"),
        "oasdiff names both breaks: {text}"
    );
}
