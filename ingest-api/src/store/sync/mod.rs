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
//! **A sync comes in bounded answers** ([`SyncBounds`]): at most `max_conversations`
//! conversations and about `max_bytes` of message bodies each. Answers go by conversation
//! id, newest conversation first (an order that changes under no write), and list their
//! own conversations by activity, as the inbox does. An answer that stops short says `hasMore` and hands out a continuation
//! ([`cursor::Continuation`]): the next call reads with a snapshot of its own, but reports
//! only the messages the first answer's snapshot saw (`upto`; migration 20261203000001),
//! and the last answer hands out `upto` as the next cursor. So a message that commits
//! while a client pages is in the next sync, not in this one and the next. A
//! conversation that changed again meanwhile can be listed in both, each time with its
//! state as it is then.

pub mod cursor;

use crate::configuration::SyncBounds;
use std::collections::HashMap;

use chatpipe_core::UserId;
use serde::Serialize;
use sqlx::{Postgres, Transaction};

use super::inbox::{state_columns, ConversationState, STATE_FROM, UNREAD};
use super::messages::{HistoryMessage, MESSAGE_COLUMNS};
use super::{Store, StoreError};
pub use cursor::{Continuation, Cursor, CursorKey, Opened, Part};

/// This server history's origin (see [`cursor`]): `<system identifier>/<timeline>`, the
/// timeline read from the WAL file being written, so a promoted standby says its new
/// timeline at once (the checkpoint's would lag until its first checkpoint).
const ORIGIN: &str = "(SELECT system_identifier FROM pg_control_system())::text || '/' || \
     (('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::int)::text";

#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct SyncPage {
    pub conversations: Vec<SyncEntry>,
    /// This sync goes on: call again at once with `nextCursor`.
    pub has_more: bool,
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
    /// Threads whose summary or whose place for the caller changed since the cursor
    /// (absent when none, and on an initial sync: history pages show them).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub threads: Vec<super::threads::ThreadChange>,
}

/// The caller's conversations with an id below `$3`, changed since `$2` (all of them
/// when `$2` is NULL), `$4` at most, walking the index on (user_id, conversation_id)
/// down from `$3` (migration 20261203000002): built once, not per request.
static STATES_SQL: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!(
        "SELECT {} {STATE_FROM}
          WHERE m.user_id = $1 AND m.conversation_id < $3
            AND ($2::pg_snapshot IS NULL
                 OR chat_changed_since(c.changed_xid, $2::pg_snapshot)
                 OR chat_changed_since(m.changed_xid, $2::pg_snapshot))
          ORDER BY m.conversation_id DESC
          LIMIT $4",
        state_columns(UNREAD)
    )
});

/// The changed messages of conversations `$1` (tops `$2`) since `$3` that `$4` saw, `$5`
/// (+1) each, newest first, in the order given, as long as their bodies add up to `$6`
/// bytes at most (the first row whatever its size); then one row more, `fits` false, that
/// says which conversation the bytes cut.
pub static MESSAGES_SQL: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!(
        "SELECT h.conv, h.fits, {MESSAGE_COLUMNS}
           FROM (SELECT g.*, count(*) FILTER (WHERE NOT g.fits)
                               OVER (ORDER BY g.ord, g.seq DESC ROWS UNBOUNDED PRECEDING) AS unfit
                   FROM (SELECT t.conv, t.ord, s.*,
                                sum(octet_length(coalesce(s.body, ''))) OVER w <= $6
                                  OR row_number() OVER w = 1 AS fits
                           FROM unnest($1::bigint[], $2::bigint[]) WITH ORDINALITY AS t(conv, top, ord)
                          CROSS JOIN LATERAL
                                chat_sync_messages(t.conv, t.top, $3::pg_snapshot, $4::pg_snapshot, $5) AS s
                         WINDOW w AS (ORDER BY t.ord, s.seq DESC ROWS UNBOUNDED PRECEDING)
                        ) AS g
                ) AS h
          WHERE h.fits OR h.unfit = 1
          ORDER BY h.ord, h.seq DESC"
    )
});

/// Whether any of the conversations `$1` had a row moved to the cold tier whose last
/// change the cursor `$2` did not see.
const MOVED_UNSEEN_SQL: &str =
    "SELECT coalesce(bool_or(chat_changed_since(moved_xid, $2::pg_snapshot)), false)
       FROM message_archive WHERE conversation_id = ANY($1)";

#[derive(sqlx::FromRow)]
struct Row {
    conv: i64,
    fits: bool,
    #[sqlx(flatten)]
    message: HistoryMessage,
}

/// One answer of a sync: what changed since `from` (everything, without messages, when
/// `None`), and the cursor to pass next.
pub async fn sync(
    db: &Store,
    key: &CursorKey,
    user: UserId,
    from: Option<&Opened>,
    limit: i64,
    bounds: SyncBounds,
) -> Result<SyncPage, StoreError> {
    let mut tx = db.pool.begin().await?;
    // One snapshot for every read below; a sync's first answer hands it out in the end.
    sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        .execute(&mut *tx)
        .await?;
    let (now, origin): (String, String) =
        sqlx::query_as(&format!("SELECT pg_current_snapshot()::text, {ORIGIN}"))
            .fetch_one(&mut *tx)
            .await?;
    if let Some(opened) = from {
        if opened.origin.as_deref() != Some(origin.as_str()) {
            metrics::counter!("sync_requests_total", "kind" => "stale").increment(1);
            return Err(StoreError::conflict(
                "cursor-stale",
                "the cursor is of another history of the database (a failover, a restore or \
                 another deployment): sync again without since",
            ));
        }
    }
    let from = from.map(|opened| &opened.cursor);
    let mut at = match from {
        None => Continuation::start(None, now),
        Some(Cursor::Snapshot(since)) => Continuation::start(Some(since.clone()), now),
        Some(Cursor::Continue(rest)) => rest.clone(),
    };
    let mut room = bounds.max_conversations;
    let mut conversations = Vec::new();
    let mut rest = None;
    if at.part == Part::Members {
        let (mut changed, next) =
            members(&mut tx, user, &at, limit, room, bounds.max_bytes).await?;
        room -= changed.len();
        // Within an answer as in the inbox: newest activity first.
        changed.sort_by(|a, b| {
            (b.state.last_activity_at, b.state.conversation_id)
                .cmp(&(a.state.last_activity_at, a.state.conversation_id))
        });
        conversations.extend(changed.into_iter().map(|c| SyncEntry::Member(Box::new(c))));
        match next {
            Some(before) => rest = Some((Part::Members, before)),
            None => (at.part, at.before) = (Part::Departed, i64::MAX),
        }
    }
    if rest.is_none() && at.since.is_some() {
        let (left, next) = departed(&mut tx, user, &at, room).await?;
        conversations.extend(left.into_iter().map(|conversation_id| SyncEntry::Left {
            conversation_id,
            left: true,
        }));
        rest = next.map(|before| (Part::Departed, before));
    }
    tx.commit().await?;

    let kind = match from {
        None => "initial",
        Some(Cursor::Snapshot(_)) => "delta",
        Some(Cursor::Continue(_)) => "continuation",
    };
    metrics::counter!("sync_requests_total", "kind" => kind).increment(1);
    let next = match rest {
        Some((part, before)) => Cursor::Continue(Continuation { part, before, ..at }),
        None => Cursor::Snapshot(at.upto),
    };
    Ok(SyncPage {
        conversations,
        has_more: matches!(next, Cursor::Continue(_)),
        next_cursor: key.seal(user, &origin, &next),
    })
}

impl Continuation {
    fn start(since: Option<String>, upto: String) -> Self {
        Self {
            since,
            upto,
            part: Part::Members,
            before: i64::MAX,
        }
    }
}

/// Up to `room` of the caller's changed conversations from `at`, with their changed
/// messages, stopping before the one whose messages would pass `max_bytes` (the first one
/// is cut instead: its newest messages and `hasMore`). The id to go on below, if any are
/// left.
async fn members(
    tx: &mut Transaction<'_, Postgres>,
    user: UserId,
    at: &Continuation,
    limit: i64,
    room: usize,
    max_bytes: usize,
) -> Result<(Vec<Changed>, Option<i64>), StoreError> {
    let mut states: Vec<ConversationState> = sqlx::query_as(STATES_SQL.as_str())
        .bind(user.get())
        .bind(at.since.as_deref())
        .bind(at.before)
        .bind(room as i64 + 1)
        .fetch_all(&mut **tx)
        .await?;
    let mut full = states.len() > room;
    states.truncate(room);

    let Some(since) = at.since.as_deref() else {
        // An initial sync: states only; `hasMore` says there is history to page.
        let next = full
            .then(|| states.last().map(|s| s.conversation_id))
            .flatten();
        count_cut(full, "conversations");
        let changed = states
            .into_iter()
            .map(|state| Changed {
                has_more: state.last_seq > 0,
                state,
                messages: Vec::new(),
                threads: Vec::new(),
            })
            .collect();
        return Ok((changed, next));
    };
    let (conversations, tops): (Vec<i64>, Vec<i64>) = states
        .iter()
        .filter(|s| s.last_seq > 0)
        .map(|s| (s.conversation_id, s.last_seq))
        .unzip();
    let rows: Vec<Row> = sqlx::query_as(MESSAGES_SQL.as_str())
        .bind(&conversations)
        .bind(&tops)
        .bind(since)
        .bind(&at.upto)
        .bind(limit as i32)
        .bind(max_bytes as i64)
        .fetch_all(&mut **tx)
        .await?;
    // A change the cursor has not seen may have left PostgreSQL for the cold tier (the
    // client was away longer than the hot window): the cursor is stale.
    let moved_unseen: bool = sqlx::query_scalar(MOVED_UNSEEN_SQL)
        .bind(&conversations)
        .bind(since)
        .fetch_one(&mut **tx)
        .await?;
    if moved_unseen {
        metrics::counter!("sync_requests_total", "kind" => "stale").increment(1);
        return Err(StoreError::conflict(
            "cursor-stale",
            "the cursor is older than the hot window: changes it has not seen are archived \
             (storage.hot_retention_s); sync again without since",
        ));
    }
    // The conversation the bytes cut, if they did: it ends the answer, unless it is the
    // first, which comes with the messages that fit.
    let mut cut_at = None;
    let mut messages: HashMap<i64, Vec<HistoryMessage>> = HashMap::new();
    for row in rows {
        if row.fits {
            messages.entry(row.conv).or_default().push(row.message);
        } else {
            cut_at = Some(row.conv);
        }
    }

    let listed: Vec<i64> = states.iter().map(|s| s.conversation_id).collect();
    let mut threads = super::threads::changed(tx, user, &listed, (since, &at.upto)).await?;
    let mut changed = Vec::with_capacity(states.len());
    for state in states {
        let cut = cut_at == Some(state.conversation_id);
        if cut && !changed.is_empty() {
            break;
        }
        // Newest first, one more than asked when there are more.
        let mut got = messages.remove(&state.conversation_id).unwrap_or_default();
        let has_more = cut || got.len() as i64 > limit;
        got.truncate(limit as usize);
        got.reverse();
        changed.push(Changed {
            threads: threads.remove(&state.conversation_id).unwrap_or_default(),
            state,
            messages: got,
            has_more,
        });
        if cut {
            break;
        }
    }
    // Reactions, mentions and threads of every message of the answer: one statement each.
    let mut shown: Vec<(i64, &mut [HistoryMessage])> = changed
        .iter_mut()
        .map(|c| (c.state.conversation_id, &mut c.messages[..]))
        .collect();
    super::messages::attach_all(tx, user, &mut shown).await?;
    let cut_bytes = cut_at.is_some();
    count_cut(cut_bytes, "bytes");
    count_cut(full && !cut_bytes, "conversations");
    full |= cut_bytes;
    let next = full
        .then(|| changed.last().map(|c| c.state.conversation_id))
        .flatten();
    Ok((changed, next))
}

/// Up to `room` conversations the caller left since the cursor, from `at`, and the id to
/// go on below, if any are left.
async fn departed(
    tx: &mut Transaction<'_, Postgres>,
    user: UserId,
    at: &Continuation,
    room: usize,
) -> Result<(Vec<i64>, Option<i64>), StoreError> {
    let mut left: Vec<i64> = sqlx::query_scalar(
        "SELECT d.conversation_id FROM conversation_departure d
          WHERE d.user_id = $1 AND d.conversation_id < $3
            AND chat_changed_since(d.changed_xid, $2::pg_snapshot)
            AND NOT EXISTS (SELECT 1 FROM conversation_member m
                             WHERE m.conversation_id = d.conversation_id
                               AND m.user_id = $1)
          ORDER BY d.conversation_id DESC
          LIMIT $4",
    )
    .bind(user.get())
    .bind(at.since.as_deref())
    .bind(at.before)
    .bind(room as i64 + 1)
    .fetch_all(&mut **tx)
    .await?;
    if left.len() <= room {
        return Ok((left, None));
    }
    left.truncate(room);
    count_cut(true, "conversations");
    let next = left.last().copied().unwrap_or(at.before);
    Ok((left, Some(next)))
}

/// `sync_answers_cut_total{bound}`: answers that stopped at a bound and go on.
fn count_cut(cut: bool, bound: &'static str) {
    if cut {
        metrics::counter!("sync_answers_cut_total", "bound" => bound).increment(1);
    }
}
