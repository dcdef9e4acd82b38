//! Every published version of every schema is in `schemas/history/<name>/v<N>.avsc`.
//! These tests check, offline, what the registry checks online, and a little more:
//! - the schema this build registers is the newest version in its history (a change to
//!   a schema is a new version file, never an edit of a published one);
//! - each version reads every older one (BACKWARD_TRANSITIVE, every subject);
//! - for FULL_TRANSITIVE subjects, every older version also reads each newer one;
//! - for `chat.events`, a consumer with any older compiled schema reads every record of
//!   the event types it knows, written with any newer version, and fails only on the
//!   new types, which docs/topics.md tells it to skip.

use std::collections::BTreeMap;
use std::path::PathBuf;

use apache_avro::reader::datum::GenericDatumReader;
use apache_avro::schema::{Name, UnionSchema};
use apache_avro::schema_compatibility::{Compatibility as Resolves, SchemaCompatibility};
use apache_avro::types::Value;
use apache_avro::writer::datum::GenericDatumWriter;
use apache_avro::Schema;

use crate::contract::{Compatibility, Contract, ALL, CHAT_EVENTS};

/// The versions of `contract`, oldest first: (file name, JSON text, parsed).
fn versions(contract: &Contract) -> Vec<(String, String, Schema)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("history")
        .join(contract.history);
    let mut numbered = BTreeMap::new();
    for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.unwrap().path();
        let file = path.file_name().unwrap().to_string_lossy().into_owned();
        let n: u32 = file
            .strip_prefix('v')
            .and_then(|f| f.strip_suffix(".avsc"))
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("{}: name versions v<N>.avsc", path.display()));
        let text = std::fs::read_to_string(&path).unwrap();
        let schema = Schema::parse_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        numbered.insert(n, (format!("{}/{file}", contract.history), text, schema));
    }
    assert_eq!(
        numbered.keys().copied().collect::<Vec<_>>(),
        (1..=numbered.len() as u32).collect::<Vec<_>>(),
        "{}: versions are v1..vN without a gap",
        dir.display()
    );
    numbered.into_values().collect()
}

#[test]
fn the_schema_of_this_build_is_the_newest_published_version() {
    for c in ALL {
        let versions = versions(&c);
        let (file, newest, _) = versions.last().unwrap();
        let json = |s: &str| serde_json::from_str::<serde_json::Value>(s).unwrap();
        assert_eq!(
            json(c.schema),
            json(newest),
            "{}: the schema differs from {file}; a change is a new version: copy it to \
             schemas/history/{}/v{}.avsc",
            c.topic,
            c.history,
            versions.len() + 1
        );
    }
}

#[test]
fn every_version_reads_every_older_one() {
    for c in ALL {
        let versions = versions(&c);
        for (i, (old, _, writer)) in versions.iter().enumerate() {
            for (new, _, reader) in &versions[i + 1..] {
                if let Err(e) = SchemaCompatibility::can_read(writer, reader) {
                    panic!(
                        "{}: {new} cannot read records written with {old}: {e}",
                        c.topic
                    );
                }
            }
        }
    }
}

#[test]
fn under_full_transitive_every_older_version_reads_each_newer_one() {
    let full: Vec<_> = ALL
        .iter()
        .filter(|c| c.compatibility == Compatibility::FullTransitive)
        .collect();
    assert!(full.len() >= 5, "the internal topics are FULL_TRANSITIVE");
    for c in full {
        let versions = versions(c);
        for (i, (old, _, reader)) in versions.iter().enumerate() {
            for (new, _, writer) in &versions[i + 1..] {
                match SchemaCompatibility::can_read(writer, reader) {
                    Ok(Resolves::Full) => {}
                    other => panic!(
                        "{}: a consumer with {old} cannot read every record of {new}: {other:?}",
                        c.topic
                    ),
                }
            }
        }
    }
}

#[test]
fn an_older_chat_events_consumer_reads_every_event_type_it_knows_and_only_new_types_fail() {
    let versions = versions(&CHAT_EVENTS);
    assert!(versions.len() >= 5);
    let mut checked = 0;
    for (i, (old, _, reader)) in versions.iter().enumerate() {
        let known = branch_names(reader);
        for (new, _, writer) in &versions[i + 1..] {
            for (index, branch) in branch_names(writer).iter().enumerate() {
                let record = envelope_with(writer, index);
                let bytes = GenericDatumWriter::builder(writer)
                    .build()
                    .and_then(|w| w.write_value_to_vec(record))
                    .unwrap_or_else(|e| panic!("{new} branch {branch}: {e}"));
                let read = GenericDatumReader::builder(writer)
                    .reader_schema(reader)
                    .build()
                    .and_then(|r| r.read_value(&mut &bytes[..]));
                if known.contains(branch) {
                    read.unwrap_or_else(|e| {
                        panic!("a consumer with {old} cannot read {branch} written with {new}: {e}")
                    });
                    checked += 1;
                } else {
                    assert!(
                        read.is_err(),
                        "{branch} is new in {new}, yet {old} reads it"
                    );
                }
            }
        }
    }
    assert!(
        checked > 20,
        "{checked} (old reader, new writer, type) cases read"
    );
}

/// The payload union of a `chat.events` envelope.
fn payload(schema: &Schema) -> &UnionSchema {
    let Schema::Record(record) = schema else {
        panic!("the envelope is a record")
    };
    let field = record.fields.iter().find(|f| f.name == "payload").unwrap();
    let Schema::Union(union) = &field.schema else {
        panic!("payload is a union")
    };
    union
}

fn branch_names(schema: &Schema) -> Vec<String> {
    payload(schema)
        .variants()
        .iter()
        .map(|v| match v {
            Schema::Record(r) => r.name.fullname(None),
            other => panic!("payload branches are records: {other:?}"),
        })
        .collect()
}

/// An envelope whose payload is branch `index`, every field a plausible value.
fn envelope_with(schema: &Schema, index: usize) -> Value {
    let Schema::Record(record) = schema else {
        unreachable!()
    };
    let names = named(schema);
    Value::Record(
        record
            .fields
            .iter()
            .map(|f| {
                let value = if f.name == "payload" {
                    let branch = &payload(schema).variants()[index];
                    Value::Union(index as u32, Box::new(sample(branch, &names)))
                } else {
                    sample(&f.schema, &names)
                };
                (f.name.clone(), value)
            })
            .collect(),
    )
}

/// The named types of `schema`, for its references.
fn named(schema: &Schema) -> std::collections::HashMap<Name, Schema> {
    fn walk(s: &Schema, into: &mut std::collections::HashMap<Name, Schema>) {
        match s {
            Schema::Record(r) => {
                into.insert(r.name.clone(), s.clone());
                r.fields.iter().for_each(|f| walk(&f.schema, into));
            }
            Schema::Enum(e) => {
                into.insert(e.name.clone(), s.clone());
            }
            Schema::Union(u) => u.variants().iter().for_each(|v| walk(v, into)),
            Schema::Array(a) => walk(&a.items, into),
            Schema::Map(m) => walk(&m.types, into),
            _ => {}
        }
    }
    let mut into = std::collections::HashMap::new();
    walk(schema, &mut into);
    into
}

/// A value of `schema`: a positive number, a short string, the first enum symbol, the
/// non-null branch of an optional field.
fn sample(schema: &Schema, names: &std::collections::HashMap<Name, Schema>) -> Value {
    match schema {
        Schema::Null => Value::Null,
        Schema::Boolean => Value::Boolean(true),
        Schema::Int => Value::Int(7),
        Schema::Long => Value::Long(7),
        Schema::String => Value::String("x".into()),
        Schema::Uuid(_) => Value::Uuid(uuid::Uuid::from_u128(7)),
        Schema::TimestampMicros => Value::TimestampMicros(1_700_000_000_000_000),
        Schema::TimestampMillis => Value::TimestampMillis(1_700_000_000_000),
        Schema::Array(a) => Value::Array(vec![sample(&a.items, names)]),
        Schema::Enum(e) => Value::Enum(0, e.symbols[0].clone()),
        Schema::Union(u) => {
            let (i, branch) = u
                .variants()
                .iter()
                .enumerate()
                .find(|(_, v)| !matches!(v, Schema::Null))
                .unwrap();
            Value::Union(i as u32, Box::new(sample(branch, names)))
        }
        Schema::Record(r) => Value::Record(
            r.fields
                .iter()
                .map(|f| (f.name.clone(), sample(&f.schema, names)))
                .collect(),
        ),
        Schema::Ref { name } => sample(&names[name], names),
        other => panic!("no sample for {other:?}: add one"),
    }
}
