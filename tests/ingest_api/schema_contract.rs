//! The registry holds chat.events to BACKWARD_TRANSITIVE and the other subjects to
//! FULL_TRANSITIVE, and the service will not start with a schema the registry calls
//! incompatible.

use std::time::Duration;

use chatpipe_schemas::contract::{Compatibility, CHAT_EVENTS, DELIVERIES};
use chatpipe_schemas::registry::{Registry, RegistryError};
use chatpipe_tests::{registry_url, spawn_app_with, JWT_SECRET};
use ingest_api::configuration::Settings;
use serde_json::Value;

/// A subject of this test's own, deleted when the guard drops.
struct Subject(String);

impl Subject {
    fn new(label: &str) -> Self {
        Self(format!(
            "cp-test-{label}-{}-value",
            uuid::Uuid::new_v4().simple()
        ))
    }
}

impl Drop for Subject {
    fn drop(&mut self) {
        // Soft delete, then permanent delete, as the Confluent API requires.
        let url = format!("{}/subjects/{}", registry_url(), self.0);
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async {
                let http = reqwest::Client::new();
                let _ = http.delete(&url).send().await;
                let _ = http.delete(format!("{url}?permanent=true")).send().await;
            });
        })
        .join();
    }
}

fn registry() -> Registry {
    Registry::new(&registry_url(), Duration::from_secs(5)).unwrap()
}

/// Our schema with one field changed by `edit`.
fn edited(edit: impl FnOnce(&mut Value)) -> String {
    let mut schema: Value = serde_json::from_str(CHAT_EVENTS.schema).unwrap();
    edit(&mut schema);
    schema.to_string()
}

#[tokio::test]
async fn the_registry_refuses_an_incompatible_change_and_accepts_a_compatible_one() {
    let registry = registry();
    let subject = Subject::new("compat");
    let v1 = registry
        .register_as(&subject.0, &CHAT_EVENTS)
        .await
        .unwrap();
    assert_eq!(
        registry
            .register_as(&subject.0, &CHAT_EVENTS)
            .await
            .unwrap(),
        v1,
        "registering the same schema again returns its id"
    );

    // conversationId long -> string: old records can no longer be read.
    let breaking = edited(|s| s["fields"][1]["type"] = "string".into());
    let refused = registry
        .register_schema(&subject.0, &breaking, CHAT_EVENTS.compatibility)
        .await;
    assert!(
        matches!(refused, Err(RegistryError::Incompatible { .. })),
        "{refused:?}"
    );

    // A new optional field with a default is a compatible evolution.
    let evolved = edited(|s| {
        s["fields"].as_array_mut().unwrap().push(serde_json::json!(
            {"name": "traceId", "type": ["null", "string"], "default": null}
        ))
    });
    let v2 = registry
        .register_schema(&subject.0, &evolved, CHAT_EVENTS.compatibility)
        .await
        .unwrap();
    assert_ne!(v2, v1);
}

/// The level the registry holds `subject` to.
async fn level_of(subject: &Subject) -> String {
    let config: Value = reqwest::get(format!("{}/config/{}", registry_url(), subject.0))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    config["compatibilityLevel"]
        .as_str()
        .or(config["compatibility"].as_str())
        .unwrap_or_default()
        .to_owned()
}

#[tokio::test]
async fn each_subject_is_held_to_its_contracts_level_and_full_refuses_what_backward_allows() {
    let registry = registry();
    let events = Subject::new("events-level");
    registry.register_as(&events.0, &CHAT_EVENTS).await.unwrap();
    assert_eq!(level_of(&events).await, "BACKWARD_TRANSITIVE");

    let deliveries = Subject::new("deliveries-level");
    registry
        .register_as(&deliveries.0, &DELIVERIES)
        .await
        .unwrap();
    assert_eq!(DELIVERIES.compatibility, Compatibility::FullTransitive);
    assert_eq!(level_of(&deliveries).await, "FULL_TRANSITIVE");

    // Dropping a field that has no default: a newer reader ignores it (backward
    // compatible), but a consumer with the older schema can no longer read new records.
    let mut dropped: Value = serde_json::from_str(DELIVERIES.schema).unwrap();
    dropped["fields"]
        .as_array_mut()
        .unwrap()
        .retain(|f| f["name"] != "light");
    let refused = registry
        .register_schema(
            &deliveries.0,
            &dropped.to_string(),
            DELIVERIES.compatibility,
        )
        .await;
    assert!(
        matches!(refused, Err(RegistryError::Incompatible { .. })),
        "FULL_TRANSITIVE refuses a removed field without default: {refused:?}"
    );
    // The same change on a BACKWARD_TRANSITIVE subject is accepted.
    let backward = Subject::new("deliveries-backward");
    registry
        .register_schema(
            &backward.0,
            DELIVERIES.schema,
            Compatibility::BackwardTransitive,
        )
        .await
        .unwrap();
    registry
        .register_schema(
            &backward.0,
            &dropped.to_string(),
            Compatibility::BackwardTransitive,
        )
        .await
        .expect("BACKWARD_TRANSITIVE accepts a removed field");
}

#[tokio::test]
async fn ingest_api_refuses_to_start_when_its_schema_is_incompatible() {
    let registry = registry();
    let subject = Subject::new("start");
    // Registered first: a version without occurredAt. This build's schema requires
    // occurredAt and has no default for it, so it cannot read those records.
    let older = edited(|s| {
        s["fields"]
            .as_array_mut()
            .unwrap()
            .retain(|f| f["name"] != "occurredAt");
    });
    registry
        .register_schema(&subject.0, &older, CHAT_EVENTS.compatibility)
        .await
        .unwrap();

    let mut settings = Settings::defaults_with_secret(JWT_SECRET);
    settings.http.addr = "127.0.0.1:0".parse().unwrap();
    settings.registry.url = registry_url();
    settings.registry.events_subject = subject.0.clone();
    let err = match ingest_api::startup::Application::build(settings).await {
        Ok(_) => panic!("ingest-api started with an incompatible schema"),
        Err(err) => format!("{err:#}"),
    };
    assert!(err.contains("incompatible"), "{err}");
}

#[tokio::test]
async fn a_running_app_registered_the_schema_it_writes_with() {
    let app = spawn_app_with(|_| {}).await;
    let conv = app.user(10).create_group(&[]).await;
    app.user(10).send_message(conv, "x").await;
    let ids: Vec<Vec<u8>> = sqlx::query_scalar("SELECT payload FROM outbox")
        .fetch_all(&app.pool)
        .await
        .unwrap();
    let latest: Value = reqwest::get(format!(
        "{}/subjects/{}/versions/latest",
        registry_url(),
        CHAT_EVENTS.subject()
    ))
    .await
    .unwrap()
    .json()
    .await
    .unwrap();
    for payload in ids {
        assert_eq!(
            u32::from_be_bytes(payload[1..5].try_into().unwrap()) as i64,
            latest["id"].as_i64().unwrap()
        );
    }
}

/// Started before the registry (a compose file, a reboot), ingest-api waits for it
/// instead of exiting, and serves once it answers.
#[tokio::test]
async fn ingest_api_started_before_the_registry_waits_for_it() {
    let (late_registry, opens) = chatpipe_tests::late_registry(Duration::from_secs(3));
    let mut settings = Settings::defaults_with_secret(JWT_SECRET);
    settings.http.addr = "127.0.0.1:0".parse().unwrap();
    settings.admin.addr = "127.0.0.1:0".parse().unwrap();
    settings.database.url = chatpipe_tests::migrated_database().await.into();
    settings.registry.url = late_registry;
    let app = ingest_api::startup::Application::build(settings)
        .await
        .expect("ingest-api starts once the registry answers");
    assert!(
        std::time::Instant::now() >= opens,
        "it started before the registry could answer"
    );
    let addr = app.local_addr();
    tokio::spawn(app.run_until_stopped(std::future::pending()));
    let ready = reqwest::get(format!("http://{addr}/readyz")).await.unwrap();
    assert_eq!(ready.status(), 200);
}

/// Every published version of every schema, registered in order on a subject of its
/// own at its contract's level: the live registry accepts each one after all those
/// before it (the offline check in `chatpipe-schemas` is apache-avro's; this is the
/// registry's own).
#[tokio::test]
async fn the_registry_accepts_every_published_version_after_the_ones_before_it() {
    let registry = registry();
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../schemas/history");
    for contract in chatpipe_schemas::contract::ALL {
        let subject = Subject::new(contract.history);
        let mut version = 1;
        loop {
            let file = root.join(contract.history).join(format!("v{version}.avsc"));
            let Ok(schema) = std::fs::read_to_string(&file) else {
                break;
            };
            registry
                .register_schema(&subject.0, &schema, contract.compatibility)
                .await
                .unwrap_or_else(|e| panic!("{}: {e}", file.display()));
            version += 1;
        }
        assert!(version > 1, "no published version of {}", contract.history);
    }
}
