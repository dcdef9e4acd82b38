//! One-call sync: every conversation of the caller that changed since a cursor, with the
//! messages that are new or changed in it, read from PostgreSQL, so it works after any
//! time offline.
//!
//! **The cursor is a PostgreSQL snapshot**, the one the sync's own REPEATABLE READ
//! transaction reads with (`pg_current_snapshot()`). Every write sync reports records
//! its transaction id in `changed_xid` (migration 20261201000007), so "changed since the
//! cursor" is "written by a transaction that the cursor's snapshot does not see". Each
//! change is in exactly one sync of a chain of cursors: the first whose snapshot sees
//! it. No clock, no sequence that commits out of order, and no per-user change log to
//! write on every message.
//!
//! The cursor goes out signed (HMAC-SHA256 with a key kept in the database, over the
//! user and the snapshot): a cursor this API did not hand to this user is refused.

use std::collections::HashMap;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use chatpipe_core::UserId;
use hmac::{Hmac, Mac};
use serde::Serialize;
use sha2::Sha256;
use sqlx::PgPool;

use super::inbox::{state_columns, ConversationState, STATE_FROM, UNREAD};
use super::messages::{HistoryMessage, MESSAGE_COLUMNS};
use super::{Store, StoreError};

/// Signs and checks sync cursors.
#[derive(Clone)]
pub struct CursorKey(Hmac<Sha256>);

/// A checked cursor: the snapshot it carries, as PostgreSQL printed it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cursor(String);

impl CursorKey {
    /// The deployment's key, made by the migration.
    pub async fn load(pool: &PgPool) -> Result<Self, sqlx::Error> {
        let key: Vec<u8> = sqlx::query_scalar("SELECT key FROM sync_cursor_key WHERE id = 1")
            .fetch_one(pool)
            .await?;
        Ok(Self::new(&key))
    }

    pub fn new(key: &[u8]) -> Self {
        Self(Hmac::new_from_slice(key).expect("HMAC takes a key of any length"))
    }

    fn mac(&self, user: UserId, snapshot: &str) -> Hmac<Sha256> {
        let mut mac = self.0.clone();
        mac.update(format!("{}\n{snapshot}", user.get()).as_bytes());
        mac
    }

    /// `<snapshot>.<signature>`, both base64url.
    pub fn seal(&self, user: UserId, snapshot: &str) -> String {
        let signature = self.mac(user, snapshot).finalize().into_bytes();
        format!(
            "{}.{}",
            URL_SAFE_NO_PAD.encode(snapshot),
            URL_SAFE_NO_PAD.encode(signature)
        )
    }

    /// The cursor in `raw`, if this key sealed it for `user`.
    pub fn open(&self, user: UserId, raw: &str) -> Option<Cursor> {
        let (snapshot, signature) = raw.split_once('.')?;
        let snapshot = String::from_utf8(URL_SAFE_NO_PAD.decode(snapshot).ok()?).ok()?;
        let signature = URL_SAFE_NO_PAD.decode(signature).ok()?;
        self.mac(user, &snapshot).verify_slice(&signature).ok()?;
        Some(Cursor(snapshot))
    }
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct SyncPage {
    pub conversations: Vec<SyncEntry>,
    /// Pass as `since` next time.
    pub next_cursor: String,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(untagged)]
pub enum SyncEntry {
    Member(Box<Changed>),
    /// The caller left or was removed since the cursor: drop the conversation.
    #[serde(rename_all = "camelCase")]
    Left {
        conversation_id: i64,
        left: bool,
    },
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Changed {
    #[serde(flatten)]
    pub state: ConversationState,
    /// New or changed since the cursor, ascending seq: the newest `limit` of them.
    pub messages: Vec<HistoryMessage>,
    /// More changed than `messages` holds: page history below the first one (`beforeSeq`).
    /// On an initial sync: the conversation has messages to page.
    pub has_more: bool,
}

/// The caller's conversations changed since `$2` (all of them when `$2` is NULL): built
/// once, not per request.
static STATES_SQL: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!(
        "SELECT {} {STATE_FROM}
          WHERE m.user_id = $1
            AND ($2::pg_snapshot IS NULL
                 OR chat_changed_since(c.changed_xid, $2::pg_snapshot)
                 OR chat_changed_since(m.changed_xid, $2::pg_snapshot))
          ORDER BY c.last_activity_at DESC, c.id DESC",
        state_columns(UNREAD)
    )
});

#[derive(sqlx::FromRow)]
struct Row {
    conv: i64,
    #[sqlx(flatten)]
    message: HistoryMessage,
}

/// Everything of `user`'s that changed since `since` (all of it, without messages, when
/// `None`), and the cursor to pass next time.
pub async fn sync(
    db: &Store,
    key: &CursorKey,
    user: UserId,
    since: Option<&Cursor>,
    limit: i64,
) -> Result<SyncPage, StoreError> {
    let since = since.map(|c| c.0.as_str());
    let mut tx = db.pool.begin().await?;
    // One snapshot for every read below, and the cursor is that snapshot.
    sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        .execute(&mut *tx)
        .await?;
    let now: String = sqlx::query_scalar("SELECT pg_current_snapshot()::text")
        .fetch_one(&mut *tx)
        .await?;
    let states: Vec<ConversationState> = sqlx::query_as(STATES_SQL.as_str())
        .bind(user.get())
        .bind(since)
        .fetch_all(&mut *tx)
        .await?;

    let mut messages: HashMap<i64, Vec<HistoryMessage>> = HashMap::new();
    let mut departed = Vec::new();
    if let Some(since) = since {
        let (conversations, tops): (Vec<i64>, Vec<i64>) = states
            .iter()
            .filter(|s| s.last_seq > 0)
            .map(|s| (s.conversation_id, s.last_seq))
            .unzip();
        let rows: Vec<Row> = sqlx::query_as(&format!(
            "SELECT t.conv, {MESSAGE_COLUMNS}
               FROM unnest($1::bigint[], $2::bigint[]) AS t(conv, top)
              CROSS JOIN LATERAL chat_sync_messages(t.conv, t.top, $3::pg_snapshot, $4) AS g"
        ))
        .bind(&conversations)
        .bind(&tops)
        .bind(since)
        .bind(limit as i32)
        .fetch_all(&mut *tx)
        .await?;
        for row in rows {
            messages.entry(row.conv).or_default().push(row.message);
        }
        departed = sqlx::query_scalar(
            "SELECT d.conversation_id FROM conversation_departure d
              WHERE d.user_id = $1 AND chat_changed_since(d.changed_xid, $2::pg_snapshot)
                AND NOT EXISTS (SELECT 1 FROM conversation_member m
                                 WHERE m.conversation_id = d.conversation_id
                                   AND m.user_id = $1)
              ORDER BY d.conversation_id",
        )
        .bind(user.get())
        .bind(since)
        .fetch_all(&mut *tx)
        .await?;
    }
    tx.commit().await?;

    let mut conversations: Vec<SyncEntry> = states
        .into_iter()
        .map(|state| {
            let (messages, has_more) = match messages.remove(&state.conversation_id) {
                // Newest first, one more than asked when there are more.
                Some(mut changed) => {
                    let has_more = changed.len() as i64 > limit;
                    changed.truncate(limit as usize);
                    changed.reverse();
                    (changed, has_more)
                }
                None => (Vec::new(), since.is_none() && state.last_seq > 0),
            };
            SyncEntry::Member(Box::new(Changed {
                state,
                messages,
                has_more,
            }))
        })
        .collect();
    conversations.extend(departed.into_iter().map(|conversation_id| SyncEntry::Left {
        conversation_id,
        left: true,
    }));
    metrics::counter!("sync_requests_total", "kind" => if since.is_some() { "delta" } else { "initial" })
        .increment(1);
    Ok(SyncPage {
        conversations,
        next_cursor: key.seal(user, &now),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cursor_opens_only_for_its_user_and_unchanged() {
        let key = CursorKey::new(b"0123456789abcdef0123456789abcdef");
        let (alice, bob) = (UserId::new(10).unwrap(), UserId::new(20).unwrap());
        let sealed = key.seal(alice, "780:790:781,785");
        assert_eq!(
            key.open(alice, &sealed),
            Some(Cursor("780:790:781,785".into()))
        );
        assert_eq!(key.open(bob, &sealed), None, "another user's cursor");
        let other = CursorKey::new(b"another key, another deployment!");
        assert_eq!(other.open(alice, &sealed), None, "another key");
        let (_, signature) = sealed.split_once('.').unwrap();
        let forged = format!("{}.{signature}", URL_SAFE_NO_PAD.encode("1:2:"));
        assert_eq!(key.open(alice, &forged), None, "a changed snapshot");
        for garbage in ["", ".", "abc", "abc.def", "!!.!!"] {
            assert_eq!(key.open(alice, garbage), None, "{garbage:?}");
        }
    }
}
