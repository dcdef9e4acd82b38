//! Reactions: a member adds a key to a message, or takes it back. Each key's count per
//! message is kept by the same transaction (`message_reaction_count`, migration
//! 20261205000004), one more or one less, so reading reactions never counts rows.
//!
//! A change runs under the conversation's lock and the message's row lock, as edits do
//! ([`super::messages::lock_target`]): a delete of the message waits for it and then
//! removes its reactions, and the distinct keys of a message are counted with nobody
//! else adding one. It stamps the message and the conversation for sync, and writes
//! `reaction.added` or `reaction.removed` with the count once it commits.

use chatpipe_core::{ConversationId, Seq, UserId};
use chatpipe_schemas::{ChatEvent, Reaction};
use serde::Serialize;

use super::messages::{live_keys, lock_target, spread, Shown};
use super::{Store, StoreError};
use crate::domain::ReactionKey;

/// One key of a message's reactions.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema, sqlx::FromRow)]
#[serde(rename_all = "camelCase")]
pub struct ReactionCount {
    /// One emoji, or a short name.
    pub key: String,
    /// How many members reacted with it.
    pub count: i64,
    /// Whether the caller is one of them.
    pub me: bool,
}

/// A message's reactions after a change.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Reactions {
    pub conversation_id: ConversationId,
    pub seq: i64,
    /// Keys in the order they first appeared on the message.
    pub reactions: Vec<ReactionCount>,
}

/// Adding or taking back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    Add,
    Remove,
}

/// The reactions of the messages (`$1`, `$2`) (conversations and seqs, pairwise), `me`
/// for user `$3`, by message, keys in the order they first appeared.
const LIST_SQL: &str = "SELECT c.conversation_id, c.seq, c.reaction AS key, c.count,
        EXISTS (SELECT 1 FROM message_reaction r
                 WHERE r.conversation_id = c.conversation_id AND r.seq = c.seq
                   AND r.reaction = c.reaction AND r.user_id = $3) AS me
   FROM unnest($1::bigint[], $2::bigint[]) AS p(conversation_id, seq)
   JOIN message_reaction_count c
     ON c.conversation_id = p.conversation_id AND c.seq = p.seq
  ORDER BY c.conversation_id, c.seq, c.first_at, c.reaction";

const ADD_SQL: &str = "INSERT INTO message_reaction (conversation_id, seq, reaction, user_id)
     VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING";

const COUNT_UP_SQL: &str =
    "INSERT INTO message_reaction_count (conversation_id, seq, reaction, count)
     VALUES ($1, $2, $3, 1)
     ON CONFLICT (conversation_id, seq, reaction)
     DO UPDATE SET count = message_reaction_count.count + 1
     RETURNING count";

const KEYS_SQL: &str =
    "SELECT count(*) FROM message_reaction_count WHERE conversation_id = $1 AND seq = $2";

const REMOVE_SQL: &str = "DELETE FROM message_reaction
      WHERE conversation_id = $1 AND seq = $2 AND reaction = $3 AND user_id = $4";

/// One less; no row when it was the last (the count stays above 0).
const COUNT_DOWN_SQL: &str = "UPDATE message_reaction_count SET count = count - 1
      WHERE conversation_id = $1 AND seq = $2 AND reaction = $3 AND count > 1
      RETURNING count";

const COUNT_GONE_SQL: &str = "DELETE FROM message_reaction_count
      WHERE conversation_id = $1 AND seq = $2 AND reaction = $3";

/// Sync reports the message as changed by this transaction (the conversation too:
/// [`super::messages::touch_conversation`], as edits do).
const STAMP_MESSAGE_SQL: &str = "UPDATE message SET changed_xid = pg_current_xact_id()
      WHERE conversation_id = $1 AND seq = $2";

/// Removes every reaction of a message (its delete does, in its transaction).
pub const CLEAR_SQL: &str = "WITH gone AS (
        DELETE FROM message_reaction WHERE conversation_id = $1 AND seq = $2)
     DELETE FROM message_reaction_count WHERE conversation_id = $1 AND seq = $2";

/// Adds (or takes back) `caller`'s reaction `key` to message `seq`: 404 for a non-member
/// and for a seq with no message, 409 once the message is deleted, 409 `reaction-limit`
/// for a new key beyond `max_keys`. Repeating it changes nothing and writes no event.
/// Answers the message's reactions.
pub async fn change(
    db: &Store,
    (conversation, seq): (ConversationId, Seq),
    caller: UserId,
    key: &ReactionKey,
    change: Change,
    max_keys: i64,
) -> Result<Reactions, StoreError> {
    db.members.require(&db.pool, conversation, caller).await?;
    let mut tx = db.pool.begin().await?;
    let target = lock_target(db, &mut tx, conversation, caller, seq).await?;
    if target.deleted {
        return Err(StoreError::conflict(
            "message-deleted",
            format!("message {seq} is deleted; a deleted message takes no reactions"),
        ));
    }
    if target.direct && change == Change::Add {
        super::blocks::refuse_in_direct(&mut tx, conversation, caller).await?;
    }
    let ids = (conversation.get(), seq.get(), key.as_str(), caller.get());
    let count = match change {
        Change::Add => add(&mut tx, ids, max_keys).await?,
        Change::Remove => remove(&mut tx, ids).await?,
    };
    let changed = match count {
        Some(count) => {
            let at = (conversation, seq);
            Some(record(db, &mut tx, at, caller, (key, change, count)).await?)
        }
        None => None,
    };
    let keys = (&[conversation.get()][..], &[seq.get()][..]);
    let reactions = list(&mut tx, keys, caller).await?;
    tx.commit().await?;
    if let Some(label) = changed {
        metrics::counter!("reactions_changed_total", "change" => label).increment(1);
    }
    Ok(Reactions {
        conversation_id: conversation,
        seq: seq.get(),
        reactions: reactions.into_iter().map(|(_, r)| r).collect(),
    })
}

/// Stamps the message and the conversation for sync and writes the change's event;
/// answers the change's metric label.
async fn record(
    db: &Store,
    tx: &mut sqlx::PgConnection,
    (conversation, seq): (ConversationId, Seq),
    caller: UserId,
    (key, change, count): (&ReactionKey, Change, i64),
) -> Result<&'static str, StoreError> {
    sqlx::query(STAMP_MESSAGE_SQL)
        .bind(conversation.get())
        .bind(seq.get())
        .execute(&mut *tx)
        .await?;
    super::messages::touch_conversation(tx, conversation, 0).await?;
    let reaction = Reaction {
        conversation_id: conversation,
        seq,
        user_id: caller,
        key: key.as_str().to_owned(),
        count,
        occurred_at: chatpipe_core::outbox::now(),
    };
    let (event, label) = match change {
        Change::Add => (ChatEvent::ReactionAdded(reaction), "added"),
        Change::Remove => (ChatEvent::ReactionRemoved(reaction), "removed"),
    };
    db.outbox.write(tx, &[event]).await?;
    Ok(label)
}

type Ids<'a> = (i64, i64, &'a str, i64);

/// The key's count after adding, `None` if the caller had reacted with it already.
async fn add(
    conn: &mut sqlx::PgConnection,
    (conversation, seq, key, user): Ids<'_>,
    max_keys: i64,
) -> Result<Option<i64>, StoreError> {
    let added = sqlx::query(ADD_SQL)
        .bind(conversation)
        .bind(seq)
        .bind(key)
        .bind(user)
        .execute(&mut *conn)
        .await?
        .rows_affected();
    if added == 0 {
        return Ok(None);
    }
    let count: i64 = sqlx::query_scalar(COUNT_UP_SQL)
        .bind(conversation)
        .bind(seq)
        .bind(key)
        .fetch_one(&mut *conn)
        .await?;
    if count == 1 {
        let keys: i64 = sqlx::query_scalar(KEYS_SQL)
            .bind(conversation)
            .bind(seq)
            .fetch_one(&mut *conn)
            .await?;
        if keys > max_keys {
            metrics::counter!("reaction_limit_rejections_total").increment(1);
            return Err(StoreError::conflict(
                "reaction-limit",
                format!("message {seq} has {max_keys} different reactions, the most a message may have; react with one of them"),
            ));
        }
    }
    Ok(Some(count))
}

/// The key's count after taking it back, `None` if the caller had not reacted with it.
async fn remove(
    conn: &mut sqlx::PgConnection,
    (conversation, seq, key, user): Ids<'_>,
) -> Result<Option<i64>, StoreError> {
    let removed = sqlx::query(REMOVE_SQL)
        .bind(conversation)
        .bind(seq)
        .bind(key)
        .bind(user)
        .execute(&mut *conn)
        .await?
        .rows_affected();
    if removed == 0 {
        return Ok(None);
    }
    let left: Option<i64> = sqlx::query_scalar(COUNT_DOWN_SQL)
        .bind(conversation)
        .bind(seq)
        .bind(key)
        .fetch_optional(&mut *conn)
        .await?;
    if left.is_none() {
        sqlx::query(COUNT_GONE_SQL)
            .bind(conversation)
            .bind(seq)
            .bind(key)
            .execute(&mut *conn)
            .await?;
    }
    Ok(Some(left.unwrap_or(0)))
}

/// The reactions of the messages `keys` ((conversations, seqs)), `me` for `caller`.
async fn list(
    conn: &mut sqlx::PgConnection,
    (conversations, seqs): (&[i64], &[i64]),
    caller: UserId,
) -> Result<Vec<((i64, i64), ReactionCount)>, sqlx::Error> {
    #[derive(sqlx::FromRow)]
    struct Row {
        conversation_id: i64,
        seq: i64,
        #[sqlx(flatten)]
        reaction: ReactionCount,
    }
    let rows: Vec<Row> = sqlx::query_as(LIST_SQL)
        .bind(conversations)
        .bind(seqs)
        .bind(caller.get())
        .fetch_all(conn)
        .await?;
    Ok(rows
        .into_iter()
        .map(|r| ((r.conversation_id, r.seq), r.reaction))
        .collect())
}

/// Fills in the reactions of the messages `shown` (deleted ones have none), `me` for
/// `caller`: one statement for all of them.
pub async fn attach(
    conn: &mut sqlx::PgConnection,
    caller: UserId,
    shown: &mut Shown<'_>,
) -> Result<(), sqlx::Error> {
    let (conversations, seqs) = live_keys(shown);
    if seqs.is_empty() {
        return Ok(());
    }
    let rows = list(conn, (&conversations, &seqs), caller).await?;
    spread(rows, shown, |m, reactions| m.reactions = reactions);
    Ok(())
}
