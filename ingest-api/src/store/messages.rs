//! History paging, edits and deletes. Sending is in [`super::send`].

use chatpipe_core::{ConversationId, Seq, UserId};
use chatpipe_schemas::{ChatEvent, MessageDeleted, MessageEdited};
use chrono::{DateTime, Utc};
use serde::Serialize;
use uuid::Uuid;

use super::conversations::lock_as_member;
use super::{Store, StoreError};
use crate::domain::ConversationKind;
use chatpipe_schemas::Role;

#[derive(Debug, Default, Serialize, utoipa::ToSchema, sqlx::FromRow)]
#[serde(rename_all = "camelCase")]
pub struct HistoryMessage {
    pub seq: i64,
    pub sender_id: i64,
    pub client_msg_id: Uuid,
    /// Absent once the message is deleted: the body is erased, not hidden.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub body: Option<String>,
    pub created_at: DateTime<Utc>,
    /// When the body was last replaced; absent if never.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub edited_at: Option<DateTime<Utc>>,
    /// `true` on a deleted message, absent otherwise.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    #[sqlx(default)]
    pub deleted: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub deleted_at: Option<DateTime<Utc>>,
    /// The members the message names, ascending; absent if none.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    #[sqlx(skip)]
    pub mentions: Vec<i64>,
    /// The message's reactions, keys in the order they first appeared; absent if none.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    #[sqlx(skip)]
    pub reactions: Vec<super::reactions::ReactionCount>,
    /// A reply: the seq of its thread's root; absent on a top-level message.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[sqlx(default)]
    pub thread_root_seq: Option<i64>,
    /// A thread's root: its replies and the reader's place in it; absent on a message
    /// nobody replied to or followed.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[sqlx(skip)]
    pub thread: Option<super::threads::ThreadSummary>,
}

/// Messages of one or more conversations as a history page or a sync answer holds
/// them: (conversation id, its messages).
pub type Shown<'a> = [(i64, &'a mut [HistoryMessage])];

/// The (conversations, seqs) of the messages of `shown` that are not deleted: those
/// whose reactions and mentions are shown (a deleted message has none).
pub fn live_keys(shown: &Shown<'_>) -> (Vec<i64>, Vec<i64>) {
    shown
        .iter()
        .flat_map(|(conversation, messages)| {
            messages
                .iter()
                .filter(|m| !m.deleted)
                .map(move |m| (*conversation, m.seq))
        })
        .unzip()
}

/// Fills in what history and sync show beside each message of `shown`, as `reader` sees
/// it: its reactions, the members it names, and a root's thread; one statement each.
pub async fn attach_all(
    conn: &mut sqlx::PgConnection,
    reader: UserId,
    shown: &mut Shown<'_>,
) -> Result<(), sqlx::Error> {
    super::reactions::attach(conn, reader, shown).await?;
    super::mentions::attach(conn, shown).await?;
    super::threads::attach(conn, reader, shown).await
}

/// Hands each message of `shown` its items of `rows` ((conversation, seq), item), in
/// their order, by `put`.
pub fn spread<T>(
    rows: Vec<((i64, i64), T)>,
    shown: &mut Shown<'_>,
    put: impl Fn(&mut HistoryMessage, Vec<T>),
) {
    let mut by_key: std::collections::HashMap<(i64, i64), Vec<T>> = Default::default();
    for (key, item) in rows {
        by_key.entry(key).or_default().push(item);
    }
    for (conversation, messages) in shown.iter_mut() {
        for message in messages.iter_mut() {
            if let Some(items) = by_key.remove(&(*conversation, message.seq)) {
                put(message, items);
            }
        }
    }
}

/// The columns a [`HistoryMessage`] is read from, for every query that returns messages.
pub const MESSAGE_COLUMNS: &str = "seq, sender_id, client_msg_id, body, created_at, edited_at,
     deleted_at IS NOT NULL AS deleted, deleted_at, thread_root_seq";

/// The message an edit or a delete acts on (`$1`, `$2`), locked.
pub const TARGET_SQL: &str =
    "SELECT sender_id, deleted_at IS NOT NULL, thread_root_seq FROM message
      WHERE conversation_id = $1 AND seq = $2 FOR UPDATE";

/// The time of a message's next version: now, but strictly later than its last one.
/// Two changes of one message wait for each other on the conversation's lock, and the
/// second may have begun (`now()`) before the first: its time would then be earlier.
/// The cold tier keeps, per cell, the write with the highest time (`chatpipe_core::cold`),
/// so each version's time must be later than the one it replaces.
const NEXT_VERSION_AT: &str =
    "greatest(now(), coalesce(edited_at, created_at) + interval '1 microsecond')";

/// An edit of `$1`, `$2` to the body `$3`, answering the message.
pub fn edit_sql() -> String {
    format!(
        "UPDATE message SET body = $3, edited_at = {NEXT_VERSION_AT}, changed_xid = pg_current_xact_id()
          WHERE conversation_id = $1 AND seq = $2
          RETURNING {MESSAGE_COLUMNS}"
    )
}

/// A delete of `$1`, `$2` by `$3`: the body erased, the seq kept.
pub fn delete_sql() -> String {
    format!(
        "UPDATE message SET body = NULL, deleted_at = {NEXT_VERSION_AT}, deleted_by = $3,
            changed_xid = pg_current_xact_id()
          WHERE conversation_id = $1 AND seq = $2
          RETURNING deleted_at"
    )
}

/// An edited message, as the edit answers it.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Edited {
    pub conversation_id: ConversationId,
    #[serde(flatten)]
    pub message: HistoryMessage,
}

/// The message a caller wants to change, read under the conversation's row lock (taken
/// first, as sends and membership changes take it, so no two orders meet). 404 for a
/// non-member, as everywhere, and for a seq with no message.
pub(super) struct Target {
    sender: UserId,
    pub(super) deleted: bool,
    /// A reply: its thread's root.
    thread_root: Option<i64>,
    /// The caller is an admin of a GROUP.
    group_admin: bool,
    pub(super) direct: bool,
}

pub(super) async fn lock_target(
    db: &Store,
    conn: &mut sqlx::PgConnection,
    conversation: ConversationId,
    caller: UserId,
    seq: Seq,
) -> Result<Target, StoreError> {
    let locked = lock_as_member(conn, conversation, caller).await?;
    let target = || {
        sqlx::query_as(TARGET_SQL)
            .bind(conversation.get())
            .bind(seq.get())
    };
    let mut row: Option<(i64, bool, Option<i64>)> = target().fetch_optional(&mut *conn).await?;
    if row.is_none() && super::archived::restore(db, conn, conversation, seq.get()).await? {
        row = target().fetch_optional(&mut *conn).await?;
    }
    let (sender, deleted, thread_root) = row.ok_or(StoreError::NotFound { what: "message" })?;
    Ok(Target {
        sender: chatpipe_core::db::id(sender)?,
        deleted,
        thread_root,
        group_admin: locked.kind == ConversationKind::Group && locked.caller_role == Role::Admin,
        direct: locked.kind == ConversationKind::Direct,
    })
}

/// Replaces the body of message `seq` of `conversation`: only its sender may (403 for
/// another member; 404 for a non-member and for a seq with no message; 409 once it is
/// deleted), and with it the members it names when `mentions` is given (else they stay).
/// Writes `message.edited` in the same transaction.
pub async fn edit(
    db: &Store,
    conversation: ConversationId,
    caller: UserId,
    seq: Seq,
    (body, mentions): (&str, Option<&[UserId]>),
) -> Result<Edited, StoreError> {
    db.members.require(&db.pool, conversation, caller).await?;
    let mut tx = db.pool.begin().await?;
    if mentions.is_some() {
        super::mentions::lock(&mut tx, &[conversation.get()]).await?;
    }
    let target = lock_target(db, &mut tx, conversation, caller, seq).await?;
    if target.sender != caller {
        return Err(StoreError::Forbidden {
            detail: "only a message's sender may edit it".into(),
        });
    }
    if target.deleted {
        return Err(StoreError::conflict(
            "message-deleted",
            format!("message {seq} is deleted; a deleted message cannot be edited"),
        ));
    }
    if target.direct {
        // Under a block nobody writes here; deleting what one wrote stays possible.
        super::blocks::refuse_in_direct(&mut tx, conversation, caller).await?;
    }
    let mut message: HistoryMessage = sqlx::query_as(&edit_sql())
        .bind(conversation.get())
        .bind(seq.get())
        .bind(body)
        .fetch_one(&mut *tx)
        .await?;
    let named = match mentions {
        Some(users) => super::mentions::set(&mut tx, conversation, seq.get(), users).await?,
        None => super::mentions::of(&mut tx, conversation, seq.get()).await?,
    };
    message.mentions = named.iter().map(|u| u.get()).collect();
    let shown = &mut [(conversation.get(), std::slice::from_mut(&mut message))];
    super::reactions::attach(&mut tx, caller, shown).await?;
    touch_conversation(&mut tx, conversation, 0).await?;
    let event = ChatEvent::MessageEdited(MessageEdited {
        conversation_id: conversation,
        seq,
        sender_id: caller,
        body: body.to_owned(),
        mentions: named,
        edited_at: message.edited_at.unwrap_or(message.created_at),
    });
    db.outbox.write(&mut tx, &[event]).await?;
    tx.commit().await?;
    Ok(Edited {
        conversation_id: conversation,
        message,
    })
}

/// What a delete did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Deleted {
    Now,
    /// It was deleted before: nothing changed, no event.
    Already,
}

/// Deletes message `seq` of `conversation`: its sender may, and so may an admin of a
/// GROUP (403 for anyone else; 404 for a non-member and for a seq with no message). The
/// body is erased; the seq stays. Repeating it changes nothing.
///
/// The unread counts stay exact (migration 20261201000007): the conversation's
/// `deleted_count` grows by one, and so does `deleted_read` of every member whose
/// watermark already passed the seq. The conversation's delete lock, taken exclusive
/// first, keeps a watermark move from counting the deleted seqs without this one while
/// this commits. A reply is not counted there (replies have counts of their own,
/// migration 20261205000008): its thread's summary and followers follow instead.
pub async fn delete(
    db: &Store,
    conversation: ConversationId,
    caller: UserId,
    seq: Seq,
) -> Result<Deleted, StoreError> {
    db.members.require(&db.pool, conversation, caller).await?;
    let mut tx = db.pool.begin().await?;
    sqlx::query("SELECT pg_advisory_xact_lock($1)")
        .bind(conversation.get())
        .execute(&mut *tx)
        .await?;
    let target = lock_target(db, &mut tx, conversation, caller, seq).await?;
    if target.sender != caller && !target.group_admin {
        return Err(StoreError::Forbidden {
            detail: "only a message's sender, or an admin of the group, may delete it".into(),
        });
    }
    if target.deleted {
        return Ok(Deleted::Already);
    }
    let deleted_at: DateTime<Utc> = sqlx::query_scalar(&delete_sql())
        .bind(conversation.get())
        .bind(seq.get())
        .bind(caller.get())
        .fetch_one(&mut *tx)
        .await?;
    touch_conversation(&mut tx, conversation, target.thread_root.is_none().into()).await?;
    sqlx::query(super::reactions::CLEAR_SQL)
        .bind(conversation.get())
        .bind(seq.get())
        .execute(&mut *tx)
        .await?;
    super::mentions::set(&mut tx, conversation, seq.get(), &[]).await?;
    match target.thread_root {
        Some(root) => super::threads::reply_deleted(&mut tx, conversation, root, seq).await?,
        None => {
            sqlx::query(
                "UPDATE conversation_member SET deleted_read = deleted_read + 1
                  WHERE conversation_id = $1 AND last_read_seq >= $2",
            )
            .bind(conversation.get())
            .bind(seq.get())
            .execute(&mut *tx)
            .await?;
        }
    }
    let event = ChatEvent::MessageDeleted(MessageDeleted {
        conversation_id: conversation,
        seq,
        sender_id: target.sender,
        deleted_by: caller,
        deleted_at,
    });
    db.outbox.write(&mut tx, &[event]).await?;
    tx.commit().await?;
    Ok(Deleted::Now)
}

/// Records that this transaction changed the conversation (for sync), adding `deleted`
/// to its count of deleted messages.
pub(super) async fn touch_conversation(
    conn: &mut sqlx::PgConnection,
    conversation: ConversationId,
    deleted: i64,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "UPDATE conversation SET deleted_count = deleted_count + $2,
                changed_xid = pg_current_xact_id()
          WHERE id = $1",
    )
    .bind(conversation.get())
    .bind(deleted)
    .execute(conn)
    .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(seq: i64, deleted: bool) -> HistoryMessage {
        HistoryMessage {
            seq,
            sender_id: 1,
            client_msg_id: Uuid::nil(),
            body: (!deleted).then(|| "hi".into()),
            created_at: DateTime::from_timestamp_micros(seq).unwrap(),
            edited_at: None,
            deleted,
            deleted_at: None,
            ..Default::default()
        }
    }

    #[test]
    fn rows_reach_their_own_conversations_message_of_a_seq_two_conversations_share() {
        let mut first = vec![message(1, false), message(2, true), message(3, false)];
        let mut second = vec![message(1, false), message(3, false)];
        let mut shown: Vec<(i64, &mut [HistoryMessage])> = vec![(7, &mut first), (9, &mut second)];
        assert_eq!(
            live_keys(&shown),
            (vec![7, 7, 9, 9], vec![1, 3, 1, 3]),
            "a deleted message shows nothing"
        );
        let rows = vec![
            ((7, 1), 20),
            ((7, 1), 21),
            ((9, 1), 30),
            ((9, 3), 31),
            ((8, 1), 99),
        ];
        spread(rows, &mut shown, |m, users| m.mentions = users);
        let of = |messages: &[HistoryMessage]| -> Vec<Vec<i64>> {
            messages.iter().map(|m| m.mentions.clone()).collect()
        };
        assert_eq!(of(&first), vec![vec![20, 21], vec![], vec![]]);
        assert_eq!(of(&second), vec![vec![30], vec![31]]);
    }
}
