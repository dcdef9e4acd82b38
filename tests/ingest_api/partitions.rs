//! The message table partitioned by hash of `conversation_id` (migration
//! 20261205000002): the messages written before the migration are all there after it
//! and the API serves and extends them; every statement of ours that reads or writes
//! `message` touches one partition per conversation, as PostgreSQL counts it for the
//! transaction (`pg_stat_xact_user_tables`), not as a plan says it might.

use std::collections::BTreeSet;

use ingest_api::store::{history, inbox, messages, reads, sync};
use sqlx::{Connection, PgConnection};

use crate::migrations::migrations_up_to;

/// The last migration before the table was partitioned.
const BEFORE_PARTITIONING: i64 = 20261205000001;
/// MESSAGE_PARTITIONS in the migration.
const PARTITIONS: i64 = 16;

/// Every row of `message`, as text, in key order: what must survive the conversion.
/// Every message row, with the columns the table had before partitioning (later
/// migrations add columns of their own).
async fn all_rows(db: &mut PgConnection) -> Vec<String> {
    sqlx::query_scalar(
        "SELECT (m.conversation_id, m.seq, m.sender_id, m.client_msg_id, m.body, m.created_at,
                 m.edited_at, m.deleted_at, m.deleted_by, m.changed_xid)::text
           FROM message m ORDER BY conversation_id, seq",
    )
    .fetch_all(db)
    .await
    .unwrap()
}

async fn partition_of(db: &mut PgConnection, conversation: i64) -> String {
    sqlx::query_scalar(
        "SELECT DISTINCT tableoid::regclass::text FROM message WHERE conversation_id = $1",
    )
    .bind(conversation)
    .fetch_one(db)
    .await
    .unwrap()
}

#[tokio::test]
async fn messages_written_before_partitioning_are_all_kept_served_and_extended() {
    let url = chatpipe_tests::fresh_database().await;
    let mut db = PgConnection::connect(&url).await.unwrap();
    migrations_up_to(BEFORE_PARTITIONING)
        .await
        .run(&mut db)
        .await
        .unwrap();
    // 20 groups of users 10, 20 and 30; 400 messages through the send function of that
    // schema; every 7th edited, every 11th deleted.
    sqlx::raw_sql(
        "INSERT INTO conversation (type, created_by, member_count)
              SELECT 'GROUP', 10, 3 FROM generate_series(1, 20);
         INSERT INTO conversation_member (conversation_id, user_id)
              SELECT c.id, u FROM conversation c, unnest(ARRAY[10, 20, 30]) u;
         SELECT count(*) FROM chat_send_many(
              ARRAY(SELECT 1 + g % 20 FROM generate_series(0, 399) g)::bigint[],
              ARRAY(SELECT 10 * (1 + g % 3) FROM generate_series(0, 399) g)::bigint[],
              ARRAY(SELECT gen_random_uuid() FROM generate_series(1, 400)),
              ARRAY(SELECT 'message ' || g FROM generate_series(1, 400) g),
              array_fill(now(), ARRAY[400]),
              ARRAY(SELECT gen_random_uuid() FROM generate_series(1, 400)),
              array_fill('\\x00'::bytea, ARRAY[400]), array_fill('\\x00'::bytea, ARRAY[400]),
              'conversation', true);
         UPDATE message SET body = 'edited ' || seq, edited_at = now() WHERE seq % 7 = 0;
         UPDATE message SET body = NULL, deleted_at = now(), deleted_by = sender_id
          WHERE seq % 11 = 0;
         UPDATE conversation c SET deleted_count = (
              SELECT count(*) FROM message m
               WHERE m.conversation_id = c.id AND m.deleted_at IS NOT NULL);
         UPDATE conversation_member r SET deleted_read = (
              SELECT count(*) FROM message m
               WHERE m.conversation_id = r.conversation_id AND m.deleted_at IS NOT NULL
                 AND m.seq <= r.last_read_seq);",
    )
    .execute(&mut db)
    .await
    .unwrap();
    let before = all_rows(&mut db).await;
    assert_eq!(before.len(), 400);

    // The app migrates the rest, the partitioning included, as its owner.
    let app = chatpipe_tests::spawn_app_with(|s| {
        s.database.url = secrecy::SecretString::from(url.clone());
    })
    .await;
    let (kind, partitions): (String, i64) = sqlx::query_as(
        "SELECT c.relkind::text, (SELECT count(*) FROM pg_inherits i WHERE i.inhparent = c.oid)
           FROM pg_class c WHERE c.oid = 'message'::regclass",
    )
    .fetch_one(&mut db)
    .await
    .unwrap();
    assert_eq!((kind.as_str(), partitions), ("p", PARTITIONS));
    assert_eq!(all_rows(&mut db).await, before, "every row, unchanged");
    let split: Vec<i64> = sqlx::query_scalar(
        "SELECT conversation_id FROM message GROUP BY 1 HAVING count(DISTINCT tableoid) > 1",
    )
    .fetch_all(&mut db)
    .await
    .unwrap();
    assert!(
        split.is_empty(),
        "one partition per conversation: {split:?}"
    );
    let used: i64 = sqlx::query_scalar("SELECT count(DISTINCT tableoid) FROM message")
        .fetch_one(&mut db)
        .await
        .unwrap();
    assert!(
        used > 1,
        "20 conversations spread over the partitions: {used}"
    );

    // History through the API is what the rows say: bodies, edits, deletes.
    let page = app
        .user(20)
        .get("/v1/conversations/3/messages?afterSeq=0&limit=100")
        .await
        .expect(200);
    let served: Vec<(i64, Option<String>, bool, bool)> = page["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            (
                m["seq"].as_i64().unwrap(),
                m["body"].as_str().map(str::to_owned),
                m["editedAt"].is_string(),
                m["deleted"].as_bool().unwrap_or(false),
            )
        })
        .collect();
    let stored: Vec<(i64, Option<String>, bool, bool)> = sqlx::query_as(
        "SELECT seq, body, edited_at IS NOT NULL, deleted_at IS NOT NULL
           FROM message WHERE conversation_id = 3 ORDER BY seq",
    )
    .fetch_all(&mut db)
    .await
    .unwrap();
    assert_eq!(served, stored);
    assert!(served.iter().any(|m| m.3) && served.iter().any(|m| m.2));

    // A send continues the conversation's seqs, in its partition.
    let partition = partition_of(&mut db, 3).await;
    let seq = app.user(10).send_message(3, "after partitioning").await;
    assert_eq!(seq, stored.len() as i64 + 1);
    assert_eq!(partition_of(&mut db, 3).await, partition);
}

/// The partitions of `message` that the transaction on `db` has scanned or changed so far.
async fn touched(db: &mut PgConnection) -> BTreeSet<String> {
    sqlx::query_scalar(
        "SELECT relname::text FROM pg_stat_xact_user_tables
          WHERE relname LIKE 'message\\_p%'
            AND seq_scan + coalesce(idx_scan, 0) + n_tup_ins + n_tup_upd + n_tup_del > 0",
    )
    .fetch_all(db)
    .await
    .unwrap()
    .into_iter()
    .collect()
}

/// Runs `statement` with its binds in a transaction of its own, rolled back after, and
/// answers the partitions it touched.
macro_rules! partitions_touched {
    ($db:expr, $statement:expr $(, $bind:expr)* $(,)?) => {{
        let mut tx = $db.begin().await.unwrap();
        sqlx::query(&$statement)
            $(.bind($bind))*
            .fetch_all(&mut *tx)
            .await
            .unwrap_or_else(|e| panic!("{}: {e}", $statement));
        let touched = touched(&mut tx).await;
        tx.rollback().await.unwrap();
        touched
    }};
}

#[tokio::test]
async fn every_statement_of_ours_on_message_touches_the_one_partition_of_its_conversation() {
    let app = chatpipe_tests::spawn_app().await;
    let (alice, bob) = (10_i64, 20_i64);
    // A few conversations first, so that the one tested is not alone in the table.
    for _ in 0..5 {
        let other = app.user(alice).create_group(&[30]).await;
        app.user(alice).send_message(other, "elsewhere").await;
    }
    let conversation = app.user(alice).create_group(&[bob]).await;
    for body in ["one", "two", "three", "four"] {
        app.user(alice).send_message(conversation, body).await;
    }
    let mut db = PgConnection::connect(&chatpipe_tests::with_database(
        &chatpipe_tests::server_url(),
        &sqlx::query_scalar::<_, String>("SELECT current_database()")
            .fetch_one(&app.pool)
            .await
            .unwrap(),
    ))
    .await
    .unwrap();
    let partitions: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_inherits WHERE inhparent = 'message'::regclass",
    )
    .fetch_one(&mut db)
    .await
    .unwrap();
    assert_eq!(partitions, PARTITIONS);
    let own: BTreeSet<String> = [partition_of(&mut db, conversation).await].into();
    let event = uuid::Uuid::new_v4;
    let nothing = vec![0_u8];

    let statements: Vec<(&str, BTreeSet<String>)> = vec![
        (
            "history, newest first",
            partitions_touched!(db, history::descending(), conversation, i64::MAX, 50_i64),
        ),
        (
            "history, oldest first",
            partitions_touched!(db, history::ascending(), conversation, 0_i64, 50_i64),
        ),
        (
            "the target of an edit or delete",
            partitions_touched!(db, messages::TARGET_SQL, conversation, 1_i64),
        ),
        (
            "an edit",
            partitions_touched!(db, messages::edit_sql(), conversation, 1_i64, "edited"),
        ),
        (
            "a delete",
            partitions_touched!(db, messages::delete_sql(), conversation, 2_i64, alice),
        ),
        (
            "a message's receipts",
            partitions_touched!(db, reads::RECEIPTS_SQL, conversation, 1_i64),
        ),
        (
            "bob's inbox (one conversation)",
            partitions_touched!(
                db,
                inbox::page_sql(inbox::UNREAD),
                bob,
                None::<chrono::DateTime<chrono::Utc>>,
                0_i64,
                50_i64,
                80_i32
            ),
        ),
        (
            "sync's messages (chat_sync_messages)",
            partitions_touched!(
                db,
                *sync::MESSAGES_SQL,
                vec![conversation],
                vec![4_i64],
                "1:1:",
                None::<String>,
                50_i32,
                1_000_000_i64
            ),
        ),
        (
            "a send (chat_send_many)",
            partitions_touched!(
                db,
                "SELECT * FROM chat_send_many($1, $2, $3, $4, $5, $6, $7, $8, 'conversation', true)",
                vec![conversation],
                vec![alice],
                vec![event()],
                vec!["five"],
                vec![chrono::Utc::now()],
                vec![event()],
                vec![nothing.clone()],
                vec![nothing.clone()]
            ),
        ),
        (
            "a read (chat_mark_read, chat_advance_reads)",
            partitions_touched!(
                db,
                "SELECT * FROM chat_mark_read($1, $2, $3, $4, $5, $6, 'conversation', true)",
                conversation,
                bob,
                3_i64,
                event(),
                nothing.clone(),
                nothing.clone()
            ),
        ),
    ];
    for (what, touched) in statements {
        assert_eq!(touched, own, "{what}");
    }
}
