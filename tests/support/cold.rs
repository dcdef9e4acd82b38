//! The cold tier in tests: `pipeline archive` as a process of its own for a test's
//! namespace (its keyspace is the namespace), and both tiers read directly — PostgreSQL's
//! `message` rows with SQL, Cassandra's with CQL of the test's own — so a test compares
//! them row by row.
//!
//! Cassandra is the one `scripts/stack up` starts, found through `CASSANDRA_NODES`
//! (default 127.0.0.1:9042). If it is not there, the test fails and says so.

use std::time::{Duration, Instant};

use scylla::client::session::Session;
use scylla::client::session_builder::SessionBuilder;
use secrecy::ExposeSecret;

use crate::stream::Pipeline;

/// A message as history keeps it, times in microseconds since the epoch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Row {
    pub seq: i64,
    pub sender: i64,
    pub client_msg_id: uuid::Uuid,
    pub body: Option<String>,
    pub created_at: i64,
    pub edited_at: Option<i64>,
    pub deleted_at: Option<i64>,
    pub deleted_by: Option<i64>,
    pub thread_root: Option<i64>,
}

pub fn cassandra_nodes() -> String {
    std::env::var("CASSANDRA_NODES").unwrap_or_else(|_| "127.0.0.1:9042".into())
}

/// A session of the test's own.
pub async fn session() -> Session {
    let nodes = cassandra_nodes();
    SessionBuilder::new()
        .known_nodes(nodes.split(','))
        .build()
        .await
        .unwrap_or_else(|e| {
            panic!(
                "Cassandra at {nodes} (CASSANDRA_NODES): {e}; is the stack up (scripts/stack up)?"
            )
        })
}

/// `pipeline archive` for `p`'s namespace: its topic, database, a group of its own and
/// the keyspace named after the namespace, [`BUCKET_SIZE`] seqs per partition. `extra` adds environment variables.
pub fn archiver_process(p: &Pipeline, extra: &[(&str, &str)]) -> tokio::process::Child {
    let bin = std::env::var("CHATPIPE_PIPELINE_BIN").unwrap_or_else(|_| {
        panic!("CHATPIPE_PIPELINE_BIN is not set: run the suite with scripts/test, which builds `pipeline`")
    });
    let s = p.receipts_settings();
    let mut cmd = tokio::process::Command::new(bin);
    cmd.arg("archive")
        .env("KAFKA_BROKERS", &s.kafka.brokers)
        .env("SCHEMA_REGISTRY_URL", &s.registry.url)
        .env("DATABASE_URL", s.database.url.expose_secret())
        .env("CASSANDRA_NODES", cassandra_nodes())
        .env("CHATPIPE_ARCHIVE__EVENTS_TOPIC", &p.topic)
        .env("CHATPIPE_ARCHIVE__GROUP", archive_group(p))
        .env("CHATPIPE_STORAGE__KEYSPACE", &p.ns)
        .env("CHATPIPE_STORAGE__BUCKET_SIZE", BUCKET_SIZE.to_string())
        .env(
            "CHATPIPE_STORAGE__REPLICATION",
            "{'class': 'SimpleStrategy', 'replication_factor': 1}",
        )
        .env("CHATPIPE_HTTP__METRICS_ADDR", "127.0.0.1:0")
        .env("RUST_LOG", "warn")
        .kill_on_drop(true);
    for (k, v) in extra {
        cmd.env(k, v);
    }
    cmd.spawn().expect("pipeline archive starts")
}

pub fn archive_group(p: &Pipeline) -> String {
    format!("{}-archive", p.ns)
}

/// Every message of `conversation` in PostgreSQL, by seq.
pub async fn postgres_rows(pool: &sqlx::PgPool, conversation: i64) -> Vec<Row> {
    type PgRow = (
        i64,
        i64,
        uuid::Uuid,
        Option<String>,
        i64,
        Option<i64>,
        Option<i64>,
        Option<i64>,
        Option<i64>,
    );
    let rows: Vec<PgRow> = sqlx::query_as(
        "SELECT seq, sender_id, client_msg_id, body,
                (extract(epoch FROM created_at) * 1000000)::BIGINT,
                (extract(epoch FROM edited_at) * 1000000)::BIGINT,
                (extract(epoch FROM deleted_at) * 1000000)::BIGINT,
                deleted_by, thread_root_seq
           FROM message WHERE conversation_id = $1 ORDER BY seq",
    )
    .bind(conversation)
    .fetch_all(pool)
    .await
    .unwrap();
    rows.into_iter()
        .map(|r| Row {
            seq: r.0,
            sender: r.1,
            client_msg_id: r.2,
            body: r.3,
            created_at: r.4,
            edited_at: r.5,
            deleted_at: r.6,
            deleted_by: r.7,
            thread_root: r.8,
        })
        .collect()
}

/// Every message of `conversation` in the keyspace with seq up to `last_seq`, by seq, read
/// partition by partition (`bucket_size` seqs each). A row with a column missing (a change
/// archived without its `message.new`) panics: the archive must hold whole messages. An
/// error: Cassandra did not answer, or the keyspace is not made yet.
pub async fn cassandra_rows(
    session: &Session,
    keyspace: &str,
    bucket_size: i64,
    conversation: i64,
    last_seq: i64,
) -> anyhow::Result<Vec<Row>> {
    type CqlRow = (
        i64,
        Option<i64>,
        Option<uuid::Uuid>,
        Option<String>,
        Option<i64>,
        Option<i64>,
        Option<i64>,
        Option<i64>,
        Option<i64>,
    );
    let mut out = Vec::new();
    for bucket in 0..=last_seq / bucket_size {
        let result = session
            .query_unpaged(
                format!(
                    "SELECT seq, sender_id, client_msg_id, body, created_at_us, edited_at_us,
                            deleted_at_us, deleted_by, thread_root_seq
                       FROM {keyspace}.message WHERE conversation_id = ? AND bucket = ?"
                ),
                (conversation, bucket),
            )
            .await?
            .into_rows_result()?;
        for row in result.rows::<CqlRow>()? {
            let r = row?;
            out.push(Row {
                seq: r.0,
                sender: r.1.expect("sender_id"),
                client_msg_id: r.2.expect("client_msg_id"),
                body: r.3,
                created_at: r.4.expect("created_at_us"),
                edited_at: r.5,
                deleted_at: r.6,
                deleted_by: r.7,
                thread_root: r.8,
            });
        }
    }
    out.retain(|r| r.seq <= last_seq);
    out.sort_by_key(|r| r.seq);
    Ok(out)
}

/// What `message_archive` says is archived for `conversation` (0: nothing).
pub async fn archived_seq(pool: &sqlx::PgPool, conversation: i64) -> i64 {
    sqlx::query_scalar::<_, i64>(
        "SELECT archived_seq FROM message_archive WHERE conversation_id = $1",
    )
    .bind(conversation)
    .fetch_optional(pool)
    .await
    .unwrap()
    .unwrap_or(0)
}

/// Waits until Cassandra holds every message of every conversation (seq 1 to the
/// conversation's `last_seq`), each row PostgreSQL still holds equal to its copy, and
/// `message_archive` records each one's last seq; panics with the first difference.
/// Before the retention step moves anything, that is: the archive equals PostgreSQL.
pub async fn wait_until_archive_equals_postgres(
    p: &Pipeline,
    session: &Session,
    conversations: &[i64],
    deadline: Duration,
) {
    let until = Instant::now() + deadline;
    loop {
        let mut difference = None;
        for &conv in conversations {
            if let Err(d) = archive_holds(p, session, conv).await {
                difference = Some(format!("conversation {conv}: {d}"));
                break;
            }
        }
        let Some(difference) = difference else {
            return;
        };
        assert!(
            Instant::now() < until,
            "the archive did not come to equal PostgreSQL within {deadline:?}: {difference}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn archive_holds(p: &Pipeline, session: &Session, conv: i64) -> Result<(), String> {
    let last: i64 = sqlx::query_scalar("SELECT last_seq FROM conversation WHERE id = $1")
        .bind(conv)
        .fetch_one(&p.app.pool)
        .await
        .unwrap();
    let hot = postgres_rows(&p.app.pool, conv).await;
    let cold = cassandra_rows(session, &p.ns, BUCKET_SIZE, conv, last)
        .await
        .map_err(|e| format!("reading Cassandra: {e}"))?;
    let recorded = archived_seq(&p.app.pool, conv).await;
    if recorded != last || cold.iter().map(|r| r.seq).ne(1..=last) {
        return Err(format!(
            "{} rows in cassandra of {last}, message_archive says {recorded}",
            cold.len()
        ));
    }
    let copies: std::collections::HashMap<i64, &Row> = cold.iter().map(|r| (r.seq, r)).collect();
    match hot.iter().find(|h| copies.get(&h.seq) != Some(h)) {
        Some(h) => Err(format!(
            "postgres {h:?}, cassandra {:?}",
            copies.get(&h.seq)
        )),
        None => Ok(()),
    }
}

/// The tests' bucket size: small, so a conversation of a few dozen messages spans
/// several Cassandra partitions.
pub const BUCKET_SIZE: i64 = 16;

/// Drops the namespace's keyspace.
pub async fn drop_keyspace(session: &Session, keyspace: &str) {
    session
        .query_unpaged(format!("DROP KEYSPACE IF EXISTS {keyspace}"), ())
        .await
        .expect("dropping the test's keyspace");
}

/// Drops the keyspaces named `<prefix>…` that `dead` says belong to a test process that
/// is gone (a run killed before its cleanup). Best effort: a cleanup, not a check.
pub async fn drop_keyspaces_of_dead_tests(prefix: &str, dead: impl Fn(&str) -> bool) {
    let nodes = cassandra_nodes();
    let Ok(session) = SessionBuilder::new()
        .known_nodes(nodes.split(','))
        .build()
        .await
    else {
        return;
    };
    let Ok(result) = session
        .query_unpaged("SELECT keyspace_name FROM system_schema.keyspaces", ())
        .await
    else {
        return;
    };
    let Ok(rows) = result.into_rows_result() else {
        return;
    };
    let names: Vec<String> = rows
        .rows::<(String,)>()
        .map(|rows| rows.filter_map(Result::ok).map(|(n,)| n).collect())
        .unwrap_or_default();
    for name in names.iter().filter(|n| n.starts_with(prefix) && dead(n)) {
        let _ = session
            .query_unpaged(format!("DROP KEYSPACE IF EXISTS {name}"), ())
            .await;
    }
}
