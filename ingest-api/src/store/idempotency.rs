//! Idempotency keys of the routes that create (`POST /v1/conversations`, `POST
//! /v1/direct`): a retry with the same `Idempotency-Key` gets the first answer, never a
//! second group. A key's row is written in the transaction of what its request made
//! (migrations/20261207000002_idempotency_keys.sql), so the two commit together or not
//! at all.

use std::time::Duration;

use serde::Serialize;
use serde_json::Value;
use sqlx::PgConnection;

use super::{now, StoreError};
use chatpipe_core::UserId;

/// A request that carries a key: whose, the key, and what it asks (the operation and
/// its normalized body, compared on a retry).
#[derive(Debug, Clone)]
pub struct Keyed {
    pub user: UserId,
    pub key: String,
    pub request: Value,
    /// How long a key is remembered (`limits.idempotency_key_retention_s`).
    pub retention: Duration,
}

/// The first answer to a key, given again.
#[derive(Debug, Clone)]
pub struct Answer {
    pub status: u16,
    pub body: Value,
}

/// What a keyed store call came to: done now, or the first request's answer.
pub enum Outcome<T> {
    Done(T),
    Replayed(Answer),
}

/// Expired keys deleted by each claim: the table stays near a retention's worth of
/// keys without a sweeper of its own.
const SWEEP: i64 = 16;

/// Takes `keyed`'s key inside `tx`: `None` when this request is its first (record the
/// answer with [`record`] before committing), or the first request's answer. A
/// concurrent request with the same key waits here until the first commits or rolls
/// back. The same key with another request is refused (409).
pub async fn claim(tx: &mut PgConnection, keyed: &Keyed) -> Result<Option<Answer>, StoreError> {
    let cutoff = now() - keyed.retention;
    sqlx::query(
        "DELETE FROM idempotency_key WHERE ctid = ANY(ARRAY(
           SELECT ctid FROM idempotency_key WHERE created_at < $1 LIMIT $2))",
    )
    .bind(cutoff)
    .bind(SWEEP)
    .execute(&mut *tx)
    .await?;
    // A row past the retention is the key's no more: this request takes it over.
    let taken = sqlx::query(
        "INSERT INTO idempotency_key AS k (user_id, key, request, status, response)
         VALUES ($1, $2, $3::jsonb, 0, 'null')
         ON CONFLICT (user_id, key) DO UPDATE
            SET request = EXCLUDED.request, status = 0, response = 'null', created_at = now()
          WHERE k.created_at < $4",
    )
    .bind(keyed.user.get())
    .bind(&keyed.key)
    .bind(keyed.request.to_string())
    .bind(cutoff)
    .execute(&mut *tx)
    .await?
    .rows_affected()
        == 1;
    if taken {
        return Ok(None);
    }
    first_answer(&mut *tx, keyed).await
}

/// The first answer to `keyed`'s key, if a request with it committed within the
/// retention; refused (409) if that request was another.
pub async fn first_answer(
    conn: &mut PgConnection,
    keyed: &Keyed,
) -> Result<Option<Answer>, StoreError> {
    let row: Option<(bool, String, i16, String)> = sqlx::query_as(
        "SELECT request = $4::jsonb, request::text, status, response::text FROM idempotency_key
          WHERE user_id = $1 AND key = $2 AND created_at >= $3",
    )
    .bind(keyed.user.get())
    .bind(&keyed.key)
    .bind(now() - keyed.retention)
    .bind(keyed.request.to_string())
    .fetch_optional(&mut *conn)
    .await?;
    let Some((same, request, status, body)) = row else {
        return Ok(None);
    };
    if !same {
        return Err(StoreError::Conflict {
            code: "idempotency-key-reused",
            detail: format!(
                "Idempotency-Key {:?} was used for another request ({request}); use a new key for a new request",
                keyed.key
            ),
        });
    }
    metrics::counter!("idempotency_replays_total").increment(1);
    Ok(Some(Answer {
        status: status as u16,
        body: serde_json::from_str(&body).unwrap_or(Value::Null),
    }))
}

/// Stores the answer of the request that claimed the key, in its transaction.
pub async fn record(
    tx: &mut PgConnection,
    keyed: &Keyed,
    status: u16,
    body: &impl Serialize,
) -> Result<(), StoreError> {
    let body = serde_json::to_string(body)
        .map_err(|e| StoreError::Database(sqlx::Error::Encode(e.into())))?;
    sqlx::query(
        "UPDATE idempotency_key SET status = $3, response = $4::jsonb
          WHERE user_id = $1 AND key = $2",
    )
    .bind(keyed.user.get())
    .bind(&keyed.key)
    .bind(status as i16)
    .bind(body)
    .execute(&mut *tx)
    .await?;
    Ok(())
}
