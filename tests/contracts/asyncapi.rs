//! docs/asyncapi.yaml: valid AsyncAPI 3 by the AsyncAPI Initiative's own parser (its
//! Avro payloads resolved from schemas/ and parsed as Avro), and complete: every topic
//! of the contract and every frame type the gateway pushes or reads is in it.

use std::collections::BTreeSet;

use chatpipe_schemas::contract::ALL;
use chatpipe_schemas::delivery::{
    DELIVERY_UPDATED, MESSAGE_DELETED, MESSAGE_EDITED, MESSAGE_NEW, READ_UPDATED, TYPING,
};

use crate::repo_root;

#[test]
fn the_asyncapi_document_is_valid_with_its_avro_payloads() {
    let dir = repo_root().join("tests/contracts/asyncapi");
    assert!(
        dir.join("node_modules/@asyncapi/parser").exists(),
        "the AsyncAPI parser is not installed: npm ci --prefix tests/contracts/asyncapi (scripts/test does)"
    );
    let out = crate::run_tool(
        "node",
        &["validate.mjs", "../../../docs/asyncapi.yaml"],
        &dir,
        "Node.js is needed for the AsyncAPI parser",
    );
    assert!(out.contains("VALID:"), "{out}");
}

#[test]
fn every_topic_and_every_frame_type_is_in_the_asyncapi_document() {
    let text = std::fs::read_to_string(repo_root().join("docs/asyncapi.yaml")).unwrap();
    let doc: serde_yaml_ng::Value =
        serde_yaml_ng::from_str(&text).expect("docs/asyncapi.yaml is YAML");
    let addresses: BTreeSet<&str> = doc["channels"]
        .as_mapping()
        .unwrap()
        .values()
        .filter_map(|c| c["address"].as_str())
        .collect();
    for contract in ALL {
        assert!(
            addresses.contains(contract.topic),
            "{} is not a channel",
            contract.topic
        );
        let schema = format!("../schemas/{}.avsc", contract.history);
        assert!(text.contains(&schema), "{schema} is not referred to");
    }
    assert!(addresses.contains("/ws"));
    let names: BTreeSet<&str> = doc["components"]["messages"]
        .as_mapping()
        .unwrap()
        .values()
        .filter_map(|m| m["name"].as_str())
        .collect();
    // What the gateway pushes, and what it reads from clients.
    for frame in [
        MESSAGE_NEW,
        MESSAGE_EDITED,
        MESSAGE_DELETED,
        READ_UPDATED,
        DELIVERY_UPDATED,
        TYPING,
        gateway::resync::RESYNC,
        "ack",
    ] {
        assert!(names.contains(frame), "no message named {frame}");
    }
}
