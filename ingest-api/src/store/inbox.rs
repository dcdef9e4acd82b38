//! The inbox: a user's conversations, newest activity first, with unread counts.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use chatpipe_core::UserId;
use chrono::{DateTime, Utc};
use serde::Serialize;

use super::{Store, StoreError};

#[derive(Debug, Serialize, utoipa::ToSchema, sqlx::FromRow)]
#[serde(rename_all = "camelCase")]
pub struct InboxEntry {
    #[sqlx(flatten)]
    #[serde(flatten)]
    pub state: ConversationState,
    #[sqlx(flatten)]
    #[serde(skip)]
    last: LastMessageRow,
    #[sqlx(skip)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_message: Option<LastMessage>,
}

/// A conversation as one member sees it: [`state_columns`].
#[derive(Debug, Serialize, utoipa::ToSchema, sqlx::FromRow)]
#[serde(rename_all = "camelCase")]
pub struct ConversationState {
    pub conversation_id: i64,
    #[serde(rename = "type")]
    pub kind: crate::domain::ConversationKind,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    pub last_seq: i64,
    pub last_read_seq: i64,
    /// The top-level messages after the watermark that are not deleted (replies are
    /// counted by thread, in `unreadThreads`). A subtraction, never a COUNT (invariant
    /// 7): `(last_seq - deleted_count - reply_count) - (last_read_seq - deleted_read -
    /// reply_read)`, every count kept by the writers (migrations 20261201000007 and
    /// 20261205000008).
    pub unread_count: i64,
    /// Threads the caller follows with a reply (not deleted) past their place in the
    /// thread: a counter the writers keep (migration 20261205000008).
    pub unread_threads: i32,
    /// Mentions of the caller after the watermark, in messages not deleted: also a
    /// subtraction, `mention_count - mention_read` (migration 20261205000005).
    pub mention_count: i64,
    /// What the caller hears about while offline (`PUT …/notifications`).
    pub notification_level: super::notifications::Level,
    /// Muted until then; absent when not muted.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub muted_until: Option<DateTime<Utc>>,
    pub member_count: i32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub peer_id: Option<i64>,
    pub last_activity_at: DateTime<Utc>,
}

#[derive(Debug, Default, sqlx::FromRow)]
struct LastMessageRow {
    last_message_seq: Option<i64>,
    last_message_sender_id: Option<i64>,
    last_message_preview: Option<String>,
    last_message_deleted: Option<bool>,
    last_message_at: Option<DateTime<Utc>>,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct LastMessage {
    pub seq: i64,
    pub sender_id: i64,
    /// The first `limits.preview_chars` characters of the body; absent once deleted.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub preview: Option<String>,
    /// `true` when the newest message is deleted, absent otherwise.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub deleted: bool,
    pub created_at: DateTime<Utc>,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct InboxPage {
    pub conversations: Vec<InboxEntry>,
    /// Pass as `cursor` for the next page; absent on the last page.
    pub next_cursor: Option<String>,
}

/// Keyset position: the (last_activity_at, id) of the last entry of the previous page.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Cursor {
    activity: DateTime<Utc>,
    conversation_id: i64,
}

impl Cursor {
    pub fn encode(&self) -> String {
        URL_SAFE_NO_PAD.encode(format!(
            "{}:{}",
            self.activity.timestamp_micros(),
            self.conversation_id
        ))
    }

    /// `None` when `raw` is not a cursor this API returned: not base64url of
    /// `<micros>:<id>`, a time outside years 1..=9999 (PostgreSQL's timestamptz would
    /// refuse some of those), or an id that is not positive.
    pub fn decode(raw: &str) -> Option<Self> {
        let text = String::from_utf8(URL_SAFE_NO_PAD.decode(raw).ok()?).ok()?;
        let (micros, id) = text.split_once(':')?;
        let activity = DateTime::from_timestamp_micros(micros.parse().ok()?)?;
        let conversation_id: i64 = id.parse().ok()?;
        use chrono::Datelike;
        ((1..=9999).contains(&activity.year()) && conversation_id > 0).then_some(Self {
            activity,
            conversation_id,
        })
    }
}

/// The unread count: the top-level messages after the watermark that are not deleted, as
/// a subtraction of counts the writers keep (invariant 7; migrations 20261201000007 and
/// 20261205000008).
pub const UNREAD: &str = "(c.last_seq - c.deleted_count - c.reply_count)
     - (m.last_read_seq - m.deleted_read - m.reply_read)";

/// A conversation's state as one member sees it, for the inbox and for sync: the columns,
/// over [`STATE_FROM`] with `$1` the member, and `unread` as the unread count.
pub(super) fn state_columns(unread: &str) -> String {
    format!(
        "c.id AS conversation_id, c.type AS kind, c.title, c.last_seq, m.last_read_seq,
         {unread} AS unread_count, m.unread_threads,
         m.mention_count - m.mention_read AS mention_count,
         m.notify_level AS notification_level, m.muted_until,
         c.member_count, c.last_activity_at,
         CASE WHEN p.user_low = $1 THEN p.user_high ELSE p.user_low END AS peer_id"
    )
}
pub(super) const STATE_FROM: &str = "FROM conversation_member m
     JOIN conversation c ON c.id = m.conversation_id
     LEFT JOIN direct_pair p ON p.conversation_id = c.id";

/// The inbox page query with `unread` as the unread count: [`UNREAD`] in the API, and the
/// inbox benchmark's contrast (counting rows) in `tests/bench/inbox_unread.rs`. The page
/// is picked first; only its rows look up their last message. Binds: `$1` the user,
/// `$2`/`$3` the cursor's activity and id (NULL/0 for the first page), `$4` the rows,
/// `$5` the preview's characters.
pub fn page_sql(unread: &str) -> String {
    let columns = state_columns(unread);
    format!(
        "SELECT s.*, lm.seq AS last_message_seq, lm.sender_id AS last_message_sender_id,
                left(lm.body, $5) AS last_message_preview,
                lm.deleted_at IS NOT NULL AS last_message_deleted,
                lm.created_at AS last_message_at
           FROM (SELECT {columns} {STATE_FROM}
                  WHERE m.user_id = $1
                    AND ($2::timestamptz IS NULL OR (c.last_activity_at, c.id) < ($2, $3))
                  ORDER BY c.last_activity_at DESC, c.id DESC
                  LIMIT $4) AS s
           -- One lookup per row, in its conversation's partition (LIMIT keeps the planner
           -- from turning it into a join with the whole table).
           LEFT JOIN LATERAL (SELECT m.seq, m.sender_id, m.body, m.deleted_at, m.created_at
                                FROM message m
                               WHERE m.conversation_id = s.conversation_id
                                 AND m.seq = s.last_seq
                               LIMIT 1) AS lm ON true
          ORDER BY s.last_activity_at DESC, s.conversation_id DESC"
    )
}

static PAGE_SQL: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| page_sql(UNREAD));

pub async fn inbox(
    db: &Store,
    user: UserId,
    cursor: Option<Cursor>,
    limit: i64,
    preview_chars: usize,
) -> Result<InboxPage, StoreError> {
    let after = cursor.map(|c| (c.activity, c.conversation_id));
    let mut conversations: Vec<InboxEntry> = sqlx::query_as(PAGE_SQL.as_str())
        .bind(user.get())
        .bind(after.map(|(t, _)| t))
        .bind(after.map(|(_, id)| id).unwrap_or(0))
        .bind(limit + 1)
        .bind(preview_chars as i32)
        .fetch_all(&db.pool)
        .await?;

    let next_cursor = if conversations.len() as i64 > limit {
        conversations.truncate(limit as usize);
        conversations.last().map(|e| {
            Cursor {
                activity: e.state.last_activity_at,
                conversation_id: e.state.conversation_id,
            }
            .encode()
        })
    } else {
        None
    };
    for entry in &mut conversations {
        let row = std::mem::take(&mut entry.last);
        if let (Some(seq), Some(sender_id), Some(deleted), Some(created_at)) = (
            row.last_message_seq,
            row.last_message_sender_id,
            row.last_message_deleted,
            row.last_message_at,
        ) {
            entry.last_message = Some(LastMessage {
                seq,
                sender_id,
                preview: row.last_message_preview,
                deleted,
                created_at,
            });
        }
    }
    Ok(InboxPage {
        conversations,
        next_cursor,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursor_round_trips_and_rejects_garbage() {
        let c = Cursor {
            activity: DateTime::from_timestamp_micros(1_700_000_000_123_456).unwrap(),
            conversation_id: 42,
        };
        assert_eq!(Cursor::decode(&c.encode()).unwrap(), c);
        assert!(Cursor::decode("not-a-cursor!").is_none());
        assert!(Cursor::decode(&URL_SAFE_NO_PAD.encode("12:x")).is_none());
        for out_of_range in ["-9223372036854775807:1", "253402300800000000:1", "12:0"] {
            assert!(Cursor::decode(&URL_SAFE_NO_PAD.encode(out_of_range)).is_none());
        }
    }
}
