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
