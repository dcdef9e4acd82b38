//! Blocks: a user says they want nothing more from another. While a block stands, in
//! their DIRECT conversation nobody writes, either way (`chat_send_many` answers
//! `blocked`, an edit is refused); the blocked user cannot open a DIRECT with the
//! blocker or add them to a group. A block is the blocker's own: the blocked user is
//! told only when they try one of these (403 `/problems/blocked`).

use chatpipe_core::{ConversationId, UserId};
use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::PgConnection;

use super::{Store, StoreError};

#[derive(Debug, Serialize, utoipa::ToSchema, sqlx::FromRow)]
#[serde(rename_all = "camelCase")]
pub struct BlockEntry {
    pub user_id: i64,
    pub blocked_at: DateTime<Utc>,
}

/// `blocker` blocks `blocked`; blocking again changes nothing.
pub async fn block(db: &Store, blocker: UserId, blocked: UserId) -> Result<(), StoreError> {
    sqlx::query(
        "INSERT INTO user_block (blocker_id, blocked_id) VALUES ($1, $2)
         ON CONFLICT DO NOTHING",
    )
    .bind(blocker.get())
    .bind(blocked.get())
    .execute(&db.pool)
    .await?;
    Ok(())
}

/// The block is lifted; lifting one that does not stand changes nothing.
pub async fn unblock(db: &Store, blocker: UserId, blocked: UserId) -> Result<(), StoreError> {
    sqlx::query("DELETE FROM user_block WHERE blocker_id = $1 AND blocked_id = $2")
        .bind(blocker.get())
        .bind(blocked.get())
        .execute(&db.pool)
        .await?;
    Ok(())
}

/// Whom `blocker` blocked, the latest first.
pub async fn list(db: &Store, blocker: UserId) -> Result<Vec<BlockEntry>, StoreError> {
    Ok(sqlx::query_as(
        "SELECT blocked_id AS user_id, blocked_at FROM user_block
          WHERE blocker_id = $1 ORDER BY blocked_at DESC, blocked_id",
    )
    .bind(blocker.get())
    .fetch_all(&db.pool)
    .await?)
}

/// Refuses when `a` or `b` blocked the other, with the sentence the caller `a` should
/// read.
pub(super) async fn refuse_between(
    conn: &mut PgConnection,
    a: UserId,
    b: UserId,
) -> Result<(), StoreError> {
    let by: Option<i64> = sqlx::query_scalar(
        "SELECT blocker_id FROM user_block
          WHERE (blocker_id, blocked_id) IN (($1, $2), ($2, $1))
          ORDER BY blocker_id = $1 DESC LIMIT 1",
    )
    .bind(a.get())
    .bind(b.get())
    .fetch_optional(conn)
    .await?;
    match by {
        None => Ok(()),
        Some(by) if by == a.get() => Err(StoreError::blocked(format!(
            "you blocked user {b}; unblock them (DELETE /blocks/{b}) to write to them"
        ))),
        Some(_) => Err(peer_refuses(b)),
    }
}

/// Refuses when a block stands between `caller` and their peer in DIRECT `conversation`.
pub(super) async fn refuse_in_direct(
    conn: &mut PgConnection,
    conversation: ConversationId,
    caller: UserId,
) -> Result<(), StoreError> {
    let peer: Option<i64> = sqlx::query_scalar(
        "SELECT CASE WHEN user_low = $2 THEN user_high ELSE user_low END
           FROM direct_pair WHERE conversation_id = $1",
    )
    .bind(conversation.get())
    .bind(caller.get())
    .fetch_optional(&mut *conn)
    .await?;
    match peer {
        Some(peer) => refuse_between(conn, caller, chatpipe_core::db::id(peer)?).await,
        None => Ok(()),
    }
}

/// Refuses when `peer` blocked `caller`.
pub(super) async fn refuse_if_blocked_by(
    conn: &mut PgConnection,
    caller: UserId,
    peer: UserId,
) -> Result<(), StoreError> {
    let blocked: bool = sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM user_block WHERE blocker_id = $1 AND blocked_id = $2)",
    )
    .bind(peer.get())
    .bind(caller.get())
    .fetch_one(conn)
    .await?;
    if blocked {
        return Err(peer_refuses(peer));
    }
    Ok(())
}

/// Refuses when any of `users` blocked `adder`, naming them (the adder may then add the
/// others).
pub(super) async fn refuse_adding(
    conn: &mut PgConnection,
    adder: UserId,
    users: &[i64],
) -> Result<(), StoreError> {
    let refusing: Vec<i64> = sqlx::query_scalar(
        "SELECT blocker_id FROM user_block
          WHERE blocked_id = $1 AND blocker_id = ANY ($2) ORDER BY blocker_id",
    )
    .bind(adder.get())
    .bind(users)
    .fetch_all(conn)
    .await?;
    if refusing.is_empty() {
        return Ok(());
    }
    let ids: Vec<String> = refusing.iter().map(i64::to_string).collect();
    Err(StoreError::blocked(format!(
        "users {} do not accept being added by you; nobody was added",
        ids.join(", ")
    )))
}

fn peer_refuses(peer: UserId) -> StoreError {
    StoreError::blocked(format!("user {peer} does not accept messages from you"))
}
