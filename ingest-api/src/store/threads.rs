//! Threads: replies under a top-level message (migration 20261205000008).
//!
//! A reply is a message with `thread_root_seq`; it takes the next conversation seq like
//! any message. Per thread, `message_thread` keeps the summary a root shows; per
//! participant, `thread_follow` keeps their read position in the thread and whether
//! they follow it. A member's `unread_threads` (followed threads with an unread reply)
//! is a counter the writers move, never a count of rows.
//!
//! Locks: sends with replies and deletes take the conversation's delete lock exclusive
//! (as mentions do, [`super::mentions::lock`]); thread reads and follows take it shared
//! (inside `chat_thread_position`), so a thread's newest reply does not move under a
//! read that compares with it.

use std::collections::HashMap;

use chatpipe_core::{ConversationId, Seq, UserId, Watermark};
use chatpipe_schemas::{ChatEvent, ThreadRead};
use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::PgConnection;

use super::history::{HistoryPage, Page};
use super::messages::{HistoryMessage, Shown, MESSAGE_COLUMNS};
use super::{Store, StoreError};

/// Why a send cannot hang a reply under the seq it names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BadRoot {
    /// No message of this conversation has that seq.
    Unknown,
    /// It is a reply itself: threads are one level deep.
    Reply,
    Deleted,
}

impl BadRoot {
    pub fn detail(self, root: i64) -> String {
        match self {
            Self::Unknown => format!("no message {root} in this conversation"),
            Self::Reply => format!("message {root} is a reply; reply to its root instead"),
            Self::Deleted => format!("message {root} is deleted"),
        }
    }
}

/// A root the send found moved to the cold tier ([`super::send::SendError::RootArchived`]),
/// as Cassandra has it: its author for a top-level message not deleted (the thread
/// keeps them, and they follow it). A deleted archived message comes back to
/// PostgreSQL first (store/archived.rs), and the send then sees it there.
pub async fn check_cold_root(
    db: &Store,
    conversation: ConversationId,
    root: Seq,
) -> Result<Result<UserId, BadRoot>, StoreError> {
    let rows = db
        .cold
        .get()
        .await
        .map_err(StoreError::ColdUnavailable)?
        .range(conversation.get(), root.get(), root.get())
        .await
        .map_err(StoreError::ColdUnavailable)?;
    let row = match rows.into_iter().next() {
        None => return Ok(Err(BadRoot::Unknown)),
        Some(row) if row.8.is_some() => return Ok(Err(BadRoot::Reply)),
        Some(row) if row.6.is_some() => return Ok(Err(BadRoot::Deleted)),
        Some(row) => row,
    };
    let author = row.1.and_then(|sender| UserId::new(sender).ok());
    author.map(Ok).ok_or_else(|| {
        StoreError::ColdUnavailable(anyhow::anyhow!(
            "archived message {root} of conversation {conversation} has no sender"
        ))
    })
}

/// A reply just erased in this transaction (under the delete lock exclusive).
pub(super) async fn reply_deleted(
    conn: &mut PgConnection,
    conversation: ConversationId,
    root: i64,
    seq: Seq,
) -> Result<(), sqlx::Error> {
    sqlx::query("SELECT chat_reply_deleted($1, $2, $3)")
        .bind(conversation.get())
        .bind(root)
        .bind(seq.get())
        .execute(conn)
        .await?;
    Ok(())
}

/// A thread as its root shows it to one reader.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema, sqlx::FromRow)]
#[serde(rename_all = "camelCase")]
pub struct ThreadSummary {
    /// Replies not deleted.
    pub reply_count: i64,
    /// The newest reply's seq (deleted or not); 0 before the first.
    pub last_reply_seq: i64,
    /// When the newest reply not deleted was sent; absent when there is none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_reply_at: Option<DateTime<Utc>>,
    /// The first (up to three) members to reply, in the order they first replied.
    pub repliers: Vec<i64>,
    /// The reader follows the thread: it counts in their `unreadThreads`.
    pub following: bool,
    /// The reader has read every reply up to this seq; absent if they never took part.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_read_seq: Option<i64>,
    /// The reader follows the thread and a reply not deleted is past their position.
    pub unread: bool,
}

/// The summary columns of `message_thread t` for the reader `$3` (`thread_follow f`).
const SUMMARY_COLUMNS: &str = "t.reply_count, t.last_reply_seq, t.last_reply_at, t.repliers,
        coalesce(f.following, false) AS following, f.last_read_seq,
        coalesce(f.following AND t.last_live_seq > f.last_read_seq, false) AS unread";

/// Fills in the thread of each top-level message of `shown` that has one, as `reader`
/// sees it: one statement for all of them.
pub async fn attach(
    conn: &mut PgConnection,
    reader: UserId,
    shown: &mut Shown<'_>,
) -> Result<(), sqlx::Error> {
    let (conversations, seqs): (Vec<i64>, Vec<i64>) = shown
        .iter()
        .flat_map(|(c, messages)| {
            messages
                .iter()
                .filter(|m| m.thread_root_seq.is_none())
                .map(move |m| (*c, m.seq))
        })
        .unzip();
    if seqs.is_empty() {
        return Ok(());
    }
    #[derive(sqlx::FromRow)]
    struct Row {
        conversation_id: i64,
        root_seq: i64,
        #[sqlx(flatten)]
        summary: ThreadSummary,
    }
    let rows: Vec<Row> = sqlx::query_as(&format!(
        "SELECT t.conversation_id, t.root_seq, {SUMMARY_COLUMNS}
           FROM unnest($1::bigint[], $2::bigint[]) AS p(c, s)
           JOIN message_thread t ON t.conversation_id = p.c AND t.root_seq = p.s
           LEFT JOIN thread_follow f ON f.conversation_id = t.conversation_id
                                    AND f.root_seq = t.root_seq AND f.user_id = $3"
    ))
    .bind(&conversations)
    .bind(&seqs)
    .bind(reader.get())
    .fetch_all(conn)
    .await?;
    let rows = rows
        .into_iter()
        .map(|r| ((r.conversation_id, r.root_seq), r.summary))
        .collect();
    super::messages::spread(rows, shown, |m, mut summaries| m.thread = summaries.pop());
    Ok(())
}

/// A page of thread `root`'s replies, in ascending seq order, with their reactions and
/// mentions. PostgreSQL's replies come from `message_reply_idx`; those the retention
/// step moved to the cold tier are named by `archived_reply` and read from Cassandra by
/// seq (a row an edit or delete brought back wins over Cassandra's copy, as in history).
pub async fn page(
    db: &Store,
    conversation: ConversationId,
    reader: UserId,
    root: Seq,
    page: Page,
    limit: i64,
) -> Result<HistoryPage, StoreError> {
    let last_seq = super::as_member(db, conversation, reader).await?.last_seq;
    // A reply, or a seq the conversation has not reached, roots no thread. A seq that
    // has left PostgreSQL is taken as asked (its replies, if any, are the page).
    let is_reply: Option<bool> = sqlx::query_scalar(
        "SELECT thread_root_seq IS NOT NULL FROM message WHERE conversation_id = $1 AND seq = $2",
    )
    .bind(conversation.get())
    .bind(root.get())
    .fetch_optional(&db.pool)
    .await?;
    let problem = match is_reply {
        Some(true) => Some(BadRoot::Reply),
        None if root.get() > last_seq => Some(BadRoot::Unknown),
        _ => None,
    };
    if let Some(problem) = problem {
        return Err(StoreError::BadParameter {
            field: "threadRootSeq",
            detail: problem.detail(root.get()),
        });
    }
    let (range, bound, ascending) = match page {
        Page::Newest => ("seq < $3 ORDER BY seq DESC", i64::MAX, false),
        Page::Before(seq) => ("seq < $3 ORDER BY seq DESC", seq, false),
        Page::After(seq) => ("seq > $3 ORDER BY seq ASC", seq, true),
    };
    let keys = (conversation.get(), root.get(), bound, limit + 1);
    let hot: Vec<HistoryMessage> = sqlx::query_as(&format!(
        "SELECT {MESSAGE_COLUMNS} FROM message
          WHERE conversation_id = $1 AND thread_root_seq = $2 AND {range} LIMIT $4"
    ))
    .bind(keys.0)
    .bind(keys.1)
    .bind(keys.2)
    .bind(keys.3)
    .fetch_all(&db.pool)
    .await?;
    let archived: Vec<i64> = sqlx::query_scalar(&format!(
        "SELECT seq FROM archived_reply
          WHERE conversation_id = $1 AND root_seq = $2 AND {range} LIMIT $4"
    ))
    .bind(keys.0)
    .bind(keys.1)
    .bind(keys.2)
    .bind(keys.3)
    .fetch_all(&db.pool)
    .await?;
    let want = (limit + 1) as usize;
    let mut messages = with_archived(db, conversation, (hot, archived), (ascending, want)).await?;
    let has_more = messages.len() as i64 > limit;
    messages.truncate(limit as usize);
    if !ascending {
        messages.reverse();
    }
    let mut conn = db.pool.acquire().await?;
    let shown = &mut [(conversation.get(), &mut messages[..])];
    super::messages::attach_all(&mut conn, reader, shown).await?;
    Ok(HistoryPage {
        messages,
        has_more,
        last_seq,
    })
}

/// The first `want` replies, in the page's direction, of PostgreSQL's `hot` and the
/// `archived` seqs; the archived ones read from PostgreSQL if an edit or delete brought
/// them back, else from Cassandra.
async fn with_archived(
    db: &Store,
    conversation: ConversationId,
    (hot, archived): (Vec<HistoryMessage>, Vec<i64>),
    (ascending, want): (bool, usize),
) -> Result<Vec<HistoryMessage>, StoreError> {
    let mut by_seq: std::collections::BTreeMap<i64, Option<HistoryMessage>> =
        hot.into_iter().map(|m| (m.seq, Some(m))).collect();
    for seq in archived {
        by_seq.entry(seq).or_insert(None);
    }
    let mut page: Vec<(i64, Option<HistoryMessage>)> = if ascending {
        by_seq.into_iter().take(want).collect()
    } else {
        by_seq.into_iter().rev().take(want).collect()
    };
    let missing: Vec<i64> = page
        .iter()
        .filter(|(_, m)| m.is_none())
        .map(|(s, _)| *s)
        .collect();
    if !missing.is_empty() {
        let back: Vec<HistoryMessage> = sqlx::query_as(&format!(
            "SELECT {MESSAGE_COLUMNS} FROM message WHERE conversation_id = $1 AND seq = ANY($2)"
        ))
        .bind(conversation.get())
        .bind(&missing)
        .fetch_all(&db.pool)
        .await?;
        let mut found: HashMap<i64, HistoryMessage> =
            back.into_iter().map(|m| (m.seq, m)).collect();
        let cold: Vec<i64> = missing
            .iter()
            .copied()
            .filter(|s| !found.contains_key(s))
            .collect();
        if !cold.is_empty() {
            let rows = db
                .cold
                .get()
                .await
                .map_err(StoreError::ColdUnavailable)?
                .seqs(conversation.get(), &cold)
                .await
                .map_err(StoreError::ColdUnavailable)?;
            metrics::counter!("history_cold_pages_total").increment(1);
            found.extend(
                rows.into_iter()
                    .filter_map(super::history::cold_message)
                    .map(|m| (m.seq, m)),
            );
        }
        for (seq, slot) in page.iter_mut() {
            if slot.is_none() {
                *slot = Some(found.remove(seq).ok_or_else(|| {
                    StoreError::corrupt(format!(
                        "archived reply {seq} of conversation {conversation} is in no tier"
                    ))
                })?);
            }
        }
    }
    Ok(page.into_iter().filter_map(|(_, m)| m).collect())
}

/// A member's place in a thread after a read, follow or unfollow.
#[derive(Debug, Serialize, utoipa::ToSchema, sqlx::FromRow)]
#[serde(rename_all = "camelCase")]
pub struct ThreadPosition {
    /// Every reply up to this seq is read; never decreases.
    pub last_read_seq: i64,
    pub following: bool,
    /// The member's followed threads in this conversation with an unread reply.
    pub unread_threads: i32,
}

/// Moves `user`'s position in thread `root` to `seq` (monotone, clamped to the newest
/// reply) and/or sets whether they follow it. A message nobody replied to yet can be
/// followed (and read) if it is a top-level message not deleted. 404 for a non-member,
/// and for a seq that is no thread's root. A change writes `thread.read` (for the
/// member's other devices) in the same transaction.
pub async fn set_position(
    db: &Store,
    conversation: ConversationId,
    user: UserId,
    root: Seq,
    (seq, following): (Option<i64>, Option<bool>),
) -> Result<ThreadPosition, StoreError> {
    db.members.require(&db.pool, conversation, user).await?;
    let mut tx = db.pool.begin().await?;
    #[derive(sqlx::FromRow)]
    struct Moved {
        #[sqlx(flatten)]
        position: ThreadPosition,
        changed: bool,
    }
    let moved: Option<Moved> = sqlx::query_as(
        "SELECT last_read_seq, following, unread_threads, changed
           FROM chat_thread_position($1, $2, $3, $4, $5)",
    )
    .bind(conversation.get())
    .bind(root.get())
    .bind(user.get())
    .bind(seq)
    .bind(following)
    .fetch_optional(&mut *tx)
    .await?;
    let Moved { position, changed } = moved.ok_or(StoreError::NotFound { what: "thread" })?;
    if changed {
        let event = ChatEvent::ThreadRead(ThreadRead {
            conversation_id: conversation,
            user_id: user,
            root_seq: root,
            last_read_seq: Watermark::new(position.last_read_seq)
                .map_err(|e| StoreError::corrupt(e.to_string()))?,
            following: position.following,
            occurred_at: super::now(),
        });
        db.outbox.write(&mut tx, &[event]).await?;
    }
    tx.commit().await?;
    Ok(position)
}

/// A thread whose summary or whose reader's place changed, as `/sync` lists it.
#[derive(Debug, Serialize, utoipa::ToSchema, sqlx::FromRow)]
#[serde(rename_all = "camelCase")]
pub struct ThreadChange {
    pub root_seq: i64,
    #[serde(flatten)]
    #[sqlx(flatten)]
    pub summary: ThreadSummary,
}

/// The threads of `conversations` whose summary, or whose place for `reader`, a
/// transaction changed that `since` does not see and `upto` does (each change in exactly
/// one sync), by conversation. Walks `message_thread_changed` and
/// `thread_follow_by_member` from the cursor's xmin.
pub async fn changed(
    conn: &mut PgConnection,
    reader: UserId,
    conversations: &[i64],
    (since, upto): (&str, &str),
) -> Result<HashMap<i64, Vec<ThreadChange>>, sqlx::Error> {
    if conversations.is_empty() {
        return Ok(HashMap::new());
    }
    #[derive(sqlx::FromRow)]
    struct Row {
        conversation_id: i64,
        #[sqlx(flatten)]
        change: ThreadChange,
    }
    let seen = |xid: &str| {
        format!(
            "{xid} >= pg_snapshot_xmin($3::pg_snapshot)
             AND chat_changed_since({xid}, $3::pg_snapshot)
             AND NOT chat_changed_since({xid}, $4::pg_snapshot)"
        )
    };
    let rows: Vec<Row> = sqlx::query_as(&format!(
        "SELECT t.conversation_id, t.root_seq, {SUMMARY_COLUMNS}
           FROM (SELECT t.conversation_id, t.root_seq FROM message_thread t
                  WHERE t.conversation_id = ANY($1) AND {}
                 UNION
                 SELECT f.conversation_id, f.root_seq FROM thread_follow f
                  WHERE f.conversation_id = ANY($1) AND f.user_id = $2 AND {}) AS k
           JOIN message_thread t USING (conversation_id, root_seq)
           LEFT JOIN thread_follow f ON f.conversation_id = t.conversation_id
                                    AND f.root_seq = t.root_seq AND f.user_id = $2
          ORDER BY t.conversation_id, t.root_seq",
        seen("t.changed_xid"),
        seen("f.changed_xid")
    ))
    .bind(conversations)
    .bind(reader.get())
    .bind(since)
    .bind(upto)
    .fetch_all(conn)
    .await?;
    let mut by_conversation: HashMap<i64, Vec<ThreadChange>> = HashMap::new();
    for row in rows {
        by_conversation
            .entry(row.conversation_id)
            .or_default()
            .push(row.change);
    }
    Ok(by_conversation)
}
