//! SQL lives here and only here. Every function that changes state writes its events to
//! the outbox inside the same transaction.

pub mod archived;
pub mod blocks;
pub mod conversations;
pub mod history;
pub mod idempotency;
pub mod inbox;
pub mod members;
pub mod mentions;
pub mod messages;
pub mod notifications;
pub mod reactions;
pub mod reads;
pub mod send;
pub mod sync;
pub mod threads;

pub use chatpipe_core::outbox::Outbox;
use sqlx::PgPool;

/// The database and the outbox: what every store function needs.
#[derive(Clone)]
pub struct Store {
    pub pool: PgPool,
    pub outbox: Outbox,
    /// Asked before any write only members may make ([`members`]).
    pub members: members::Members,
    /// Archived messages ([`history`], and edits and deletes of them).
    pub cold: chatpipe_core::cold::ColdTier,
}

pub use chatpipe_core::outbox::now;

use chatpipe_core::{ConversationId, UserId};

/// Why a store function changed nothing. The routes turn it into an `ApiError` (its
/// status and problem type); the store knows nothing of HTTP.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// Unknown, or the caller is not a member: the same answer, so a stranger learns
    /// nothing about what exists.
    #[error("{what} not found")]
    NotFound { what: &'static str },
    /// The caller may see it but not do this to it.
    #[error("{detail}")]
    Forbidden { detail: String },
    /// The change contradicts what is stored (a rule or a limit).
    #[error("{detail}")]
    Conflict { code: &'static str, detail: String },
    /// A query parameter names what cannot be (400 naming it).
    #[error("{detail}")]
    BadParameter { field: &'static str, detail: String },
    /// A block stands between the caller and a user this would reach ([`blocks`]).
    #[error("{detail}")]
    Blocked { detail: String },
    /// The cold tier (Cassandra) did not answer a request that needs it.
    #[error("the cold tier is unavailable: {0:#}")]
    ColdUnavailable(anyhow::Error),
    #[error(transparent)]
    Database(#[from] sqlx::Error),
}

impl StoreError {
    pub fn conversation_not_found() -> Self {
        Self::NotFound {
            what: "conversation",
        }
    }

    /// A value in the database this code cannot read (a failure, 500).
    pub fn corrupt(detail: String) -> Self {
        Self::Database(sqlx::Error::Decode(detail.into()))
    }

    pub fn conflict(code: &'static str, detail: impl Into<String>) -> Self {
        Self::Conflict {
            code,
            detail: detail.into(),
        }
    }

    pub fn blocked(detail: impl Into<String>) -> Self {
        metrics::counter!("blocked_refusals_total").increment(1);
        Self::Blocked {
            detail: detail.into(),
        }
    }
}

/// A conversation as one of its members sees it: what every conversation-scoped read
/// checks first.
#[derive(Debug, sqlx::FromRow)]
pub struct MemberView {
    #[sqlx(rename = "type")]
    pub kind: crate::domain::ConversationKind,
    pub member_count: i32,
    pub last_seq: i64,
    pub last_read_seq: i64,
    pub last_delivered_seq: i64,
}

/// The conversation seen by `user`, or 404 when it does not exist or `user` is not a
/// member (the same answer, so a stranger learns nothing).
pub async fn as_member(
    db: &Store,
    conversation: ConversationId,
    user: UserId,
) -> Result<MemberView, StoreError> {
    sqlx::query_as(
        "SELECT c.type, c.member_count, c.last_seq, m.last_read_seq, m.last_delivered_seq
           FROM conversation c
           JOIN conversation_member m ON m.conversation_id = c.id AND m.user_id = $2
          WHERE c.id = $1",
    )
    .bind(conversation.get())
    .bind(user.get())
    .fetch_optional(&db.pool)
    .await?
    .ok_or_else(StoreError::conversation_not_found)
}
