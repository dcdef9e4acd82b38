//! docs/asyncapi.yaml: valid AsyncAPI 3 by the AsyncAPI Initiative's own parser (its
//! Avro payloads resolved from schemas/ and parsed as Avro), and complete: every topic
//! of the contract and every frame type the gateway pushes or reads is in it; and every
//! frame the gateway makes (`gateway::Frame`, each kind full and light) is valid against
//! its payload schema there.

use std::collections::BTreeSet;

use chatpipe_schemas::contract::ALL;
use chatpipe_schemas::delivery::{
    DELIVERY_UPDATED, MENTION, MESSAGE_DELETED, MESSAGE_EDITED, MESSAGE_NEW, REACTION_ADDED,
    REACTION_REMOVED, READ_UPDATED, THREAD_READ, TYPING,
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
        REACTION_ADDED,
        REACTION_REMOVED,
        THREAD_READ,
        MENTION,
        TYPING,
        gateway::resync::RESYNC,
        "ready",
        "ack",
    ] {
        assert!(names.contains(frame), "no message named {frame}");
    }
}

/// One fanout list of each kind, full and light, and each resync: the frames the
/// gateway makes of them, validated by jsonschema against docs/asyncapi.yaml (whose
/// server frames allow no other property).
#[test]
fn every_frame_the_gateway_makes_is_valid_against_its_asyncapi_payload() {
    use chatpipe_schemas::delivery::Delivery;
    use chatpipe_schemas::{ConversationId, Seq, UserId, Watermark};
    use gateway::resync::Cause;
    use gateway::Frame;

    let list = |event_type: &str, light: bool| Delivery {
        gateway_id: "gw-0".into(),
        user_ids: vec![UserId::of(7)],
        light,
        event_type: event_type.into(),
        conversation_id: ConversationId::of(38),
        seq: Some(Seq::of(4)),
        sender_id: Some(UserId::of(95601)),
        body: Some("See you!".into()),
        user_id: Some(UserId::of(7)),
        last_read_seq: Some(Watermark::of(4)),
        last_delivered_seq: Some(Watermark::of(4)),
        occurred_at: 1_796_000_000_000_000,
        client_msg_id: Some(uuid::Uuid::new_v4()),
        reaction_key: Some("👍".into()),
        reaction_count: Some(2),
        mentions: vec![UserId::of(8)],
        thread_root_seq: Some(Seq::of(3)),
        following: Some(true),
    };
    let mut frames = Vec::new();
    for (event_type, message) in [
        (MESSAGE_NEW, "messageNew"),
        (MESSAGE_EDITED, "messageEdited"),
        (MESSAGE_DELETED, "messageDeleted"),
        (READ_UPDATED, "readUpdated"),
        (DELIVERY_UPDATED, "deliveryUpdated"),
        (REACTION_ADDED, "reactionAdded"),
        (REACTION_REMOVED, "reactionRemoved"),
        (THREAD_READ, "threadRead"),
        (MENTION, "mention"),
        (TYPING, "typingPush"),
    ] {
        for light in [false, true] {
            let frame = Frame::of(&list(event_type, light)).expect("a known event type");
            let json: serde_json::Value = serde_json::from_str(&frame.text()).unwrap();
            assert_eq!(json["type"], event_type, "{json}");
            frames.push(serde_json::json!({"message": message, "frame": json}));
        }
    }
    assert!(Frame::of(&list("message.reacted", false)).is_none());
    for cause in [Cause::Presence, Cause::Deliveries] {
        let frame = Frame::Resync {
            reason: cause.reason(),
        };
        let json: serde_json::Value = serde_json::from_str(&frame.text()).unwrap();
        assert_eq!(json["type"], gateway::resync::RESYNC);
        frames.push(serde_json::json!({"message": "resync", "frame": json}));
    }
    let ready: serde_json::Value = serde_json::from_str(&Frame::ready().text()).unwrap();
    assert_eq!(ready["type"], "ready");
    frames.push(serde_json::json!({"message": "ready", "frame": ready}));
    let file = std::env::temp_dir().join(format!("chatpipe-frames-{}.json", std::process::id()));
    std::fs::write(&file, serde_json::to_vec(&frames).unwrap()).unwrap();
    let out = crate::run_python(&[
        "tests/contracts/frames.py",
        "docs/asyncapi.yaml",
        file.to_str().unwrap(),
    ]);
    assert_eq!(out.matches("ok ").count(), frames.len(), "{out}");
}
