//! Mentions: the members a message names. Each named member has a row in
//! `message_mention` while the message names them, and the member's unread mentions are
//! a subtraction of two counters the writers keep (`mention_count - mention_read`,
//! migration 20261205000005), moved by the send, edits, deletes and every watermark move.
//!
//! The writers of mention rows hold the conversation's delete lock exclusive
//! (`pg_advisory_xact_lock`), taken before the conversation's row lock as deletes take
//! it; a watermark move takes it shared first. So a move either sees a mention row or
//! the row's writer sees the moved watermark, and no mention is counted twice or never.

use chatpipe_core::{ConversationId, UserId};
use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::PgConnection;

use super::messages::{live_keys, spread, Shown};
use super::{Store, StoreError};

/// Takes the delete locks of `conversations` exclusive, in id order (the order deletes
/// and every other holder take them in).
pub async fn lock(conn: &mut PgConnection, conversations: &[i64]) -> Result<(), sqlx::Error> {
    let mut ids = conversations.to_vec();
    ids.sort_unstable();
    ids.dedup();
    sqlx::query("SELECT pg_advisory_xact_lock(c) FROM unnest($1::bigint[]) AS c ORDER BY c")
        .bind(&ids)
        .execute(conn)
        .await?;
    Ok(())
}

/// Those of `users` who are not members of `conversation`.
pub async fn non_members(
    db: &Store,
    conversation: ConversationId,
    users: &[UserId],
) -> Result<Vec<i64>, StoreError> {
    let users: Vec<i64> = users.iter().map(|u| u.get()).collect();
    Ok(sqlx::query_scalar(
        "SELECT u FROM unnest($2::bigint[]) AS u
          WHERE NOT EXISTS (SELECT 1 FROM conversation_member m
                             WHERE m.conversation_id = $1 AND m.user_id = u)
          ORDER BY u",
    )
    .bind(conversation.get())
    .bind(&users)
    .fetch_all(&db.pool)
    .await?)
}

/// A conversation as `@all` needs it: its type, whether the author is one of its admins,
/// and every other member.
pub struct Everyone {
    pub kind: crate::domain::ConversationKind,
    pub admin: bool,
    pub others: Vec<UserId>,
}

/// [`Everyone`] of `conversation` for `author`; 404 when the author is not a member.
pub async fn everyone(
    db: &Store,
    conversation: ConversationId,
    author: UserId,
) -> Result<Everyone, StoreError> {
    let row: Option<(crate::domain::ConversationKind, bool, Vec<i64>)> = sqlx::query_as(
        "SELECT c.type, a.role = 'ADMIN',
                ARRAY(SELECT m.user_id FROM conversation_member m
                       WHERE m.conversation_id = c.id AND m.user_id <> $2 ORDER BY m.user_id)
           FROM conversation c
           JOIN conversation_member a ON a.conversation_id = c.id AND a.user_id = $2
          WHERE c.id = $1",
    )
    .bind(conversation.get())
    .bind(author.get())
    .fetch_optional(&db.pool)
    .await?;
    let (kind, admin, others) = row.ok_or_else(StoreError::conversation_not_found)?;
    Ok(Everyone {
        kind,
        admin,
        others: ids(others)?,
    })
}

/// One message just sent and the users it names.
pub struct Sent<'a> {
    pub conversation: ConversationId,
    pub seq: i64,
    pub sender: UserId,
    pub created_at: DateTime<Utc>,
    pub mentions: &'a [UserId],
}

/// Records the mentions of messages just committed in this transaction (under
/// [`lock`] and the send's row locks): rows for the named members, and their counters.
pub async fn record(conn: &mut PgConnection, sent: &[Sent<'_>]) -> Result<(), sqlx::Error> {
    let (mut conversations, mut seqs, mut users, mut senders, mut times) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for s in sent {
        for user in s.mentions {
            conversations.push(s.conversation.get());
            seqs.push(s.seq);
            users.push(user.get());
            senders.push(s.sender.get());
            times.push(s.created_at);
        }
    }
    if users.is_empty() {
        return Ok(());
    }
    sqlx::query("SELECT chat_record_mentions($1, $2, $3, $4, $5)")
        .bind(&conversations)
        .bind(&seqs)
        .bind(&users)
        .bind(&senders)
        .bind(&times)
        .execute(conn)
        .await?;
    Ok(())
}

/// Sets the members message `seq` names to `users` (an edit; none for a delete); answers
/// those named afterwards. Under [`lock`] and the message's row lock.
pub async fn set(
    conn: &mut PgConnection,
    conversation: ConversationId,
    seq: i64,
    users: &[UserId],
) -> Result<Vec<UserId>, StoreError> {
    let users: Vec<i64> = users.iter().map(|u| u.get()).collect();
    let named: Vec<i64> = sqlx::query_scalar("SELECT chat_set_mentions($1, $2, $3)")
        .bind(conversation.get())
        .bind(seq)
        .bind(&users)
        .fetch_one(conn)
        .await?;
    ids(named)
}

/// The members message `seq` names now.
pub async fn of(
    conn: &mut PgConnection,
    conversation: ConversationId,
    seq: i64,
) -> Result<Vec<UserId>, StoreError> {
    let named: Vec<i64> = sqlx::query_scalar(
        "SELECT user_id FROM message_mention WHERE conversation_id = $1 AND seq = $2
          ORDER BY user_id",
    )
    .bind(conversation.get())
    .bind(seq)
    .fetch_all(conn)
    .await?;
    ids(named)
}

fn ids(raw: Vec<i64>) -> Result<Vec<UserId>, StoreError> {
    raw.into_iter()
        .map(|u| chatpipe_core::db::id(u).map_err(StoreError::from))
        .collect()
}

/// Fills in who each of the messages `shown` names: one statement for all of them.
pub async fn attach(conn: &mut PgConnection, shown: &mut Shown<'_>) -> Result<(), sqlx::Error> {
    let (conversations, seqs) = live_keys(shown);
    if seqs.is_empty() {
        return Ok(());
    }
    let rows: Vec<(i64, i64, i64)> = sqlx::query_as(
        "SELECT n.conversation_id, n.seq, n.user_id
           FROM unnest($1::bigint[], $2::bigint[]) AS p(conversation_id, seq)
           JOIN message_mention n
             ON n.conversation_id = p.conversation_id AND n.seq = p.seq
          ORDER BY n.conversation_id, n.seq, n.user_id",
    )
    .bind(&conversations)
    .bind(&seqs)
    .fetch_all(conn)
    .await?;
    let rows = rows
        .into_iter()
        .map(|(c, seq, user)| ((c, seq), user))
        .collect();
    spread(rows, shown, |m, users| m.mentions = users);
    Ok(())
}

/// One mention of the caller, as `GET /mentions` lists it.
#[derive(Debug, Serialize, utoipa::ToSchema, sqlx::FromRow)]
#[serde(rename_all = "camelCase")]
pub struct Mention {
    pub conversation_id: i64,
    pub seq: i64,
    pub sender_id: i64,
    pub created_at: DateTime<Utc>,
    /// Above the caller's read watermark of the conversation.
    pub unread: bool,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct MentionPage {
    /// Newest first.
    pub mentions: Vec<Mention>,
    /// Pass as `cursor` for the next page; absent on the last page.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_cursor: Option<String>,
}

/// Where a page of mentions starts: after (created_at, conversation, seq), newest first.
pub type After = Option<(DateTime<Utc>, i64, i64)>;

/// The caller's mentions, newest first, walking `message_mention_by_user`.
pub async fn list(
    db: &Store,
    user: UserId,
    after: After,
    limit: i64,
) -> Result<(Vec<Mention>, bool), StoreError> {
    let (at, conversation, seq) = after.unwrap_or((DateTime::<Utc>::MAX_UTC, i64::MAX, i64::MAX));
    let mut rows: Vec<Mention> = sqlx::query_as(
        "SELECT n.conversation_id, n.seq, n.sender_id, n.created_at,
                n.seq > m.last_read_seq AS unread
           FROM message_mention n
           JOIN conversation_member m USING (conversation_id, user_id)
          WHERE n.user_id = $1
            AND (n.created_at, n.conversation_id, n.seq) < ($2, $3, $4)
          ORDER BY n.created_at DESC, n.conversation_id DESC, n.seq DESC
          LIMIT $5",
    )
    .bind(user.get())
    .bind(at)
    .bind(conversation)
    .bind(seq)
    .bind(limit + 1)
    .fetch_all(&db.pool)
    .await?;
    let more = rows.len() as i64 > limit;
    rows.truncate(limit as usize);
    Ok((rows, more))
}
