//! A member's notification level for a conversation (`conversation_member.notify_level`
//! and `muted_until`, migration 20261205000006): what the member hears about while
//! offline. The inbox and sync show it; the notifications processor reads it.

use chatpipe_core::{ConversationId, UserId};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::{Store, StoreError};

/// What a member hears about while offline.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, sqlx::Type, utoipa::ToSchema,
)]
#[serde(rename_all = "lowercase")]
#[sqlx(type_name = "text", rename_all = "lowercase")]
pub enum Level {
    /// Every message.
    All,
    /// Messages that name them (mentions) only.
    Mentions,
    /// Nothing.
    None,
}

/// A member's setting, as `PUT …/notifications` answers it.
#[derive(Debug, Serialize, utoipa::ToSchema, sqlx::FromRow)]
#[serde(rename_all = "camelCase")]
pub struct Setting {
    pub conversation_id: i64,
    pub level: Level,
    /// Nothing at all until then; absent when not muted.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub muted_until: Option<DateTime<Utc>>,
}

/// Sets `user`'s level in `conversation` (404 for a non-member, as everywhere).
pub async fn set(
    db: &Store,
    conversation: ConversationId,
    user: UserId,
    level: Level,
    muted_until: Option<DateTime<Utc>>,
) -> Result<Setting, StoreError> {
    let setting: Option<Setting> = sqlx::query_as(
        "UPDATE conversation_member
            SET notify_level = $3, muted_until = $4, changed_xid = pg_current_xact_id()
          WHERE conversation_id = $1 AND user_id = $2
         RETURNING conversation_id, notify_level AS level, muted_until",
    )
    .bind(conversation.get())
    .bind(user.get())
    .bind(level)
    .bind(muted_until)
    .fetch_optional(&db.pool)
    .await?;
    setting.ok_or_else(StoreError::conversation_not_found)
}
