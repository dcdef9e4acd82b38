//! Who is a member, asked before anything queues or locks. Every write that only members
//! may make (a send, an edit, a delete, a membership change) asks here first, so a
//! non-member's request is refused (404, as for a conversation that does not exist)
//! without creating a send lane, taking the conversation's row lock or its delete lock:
//! a few accounts flooding a conversation they are not in cannot make its members wait.
//!
//! Members are remembered for `membership.cache_ttl_ms` in a bounded LRU; a non-member is
//! asked of PostgreSQL each time (one primary-key read, no lock, limited by the caller's
//! rate limit). The cache only gates: the write itself checks membership again under its
//! lock, so a member removed a moment ago is still refused there.

use std::num::NonZeroUsize;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chatpipe_core::{ConversationId, UserId};
use lru::LruCache;
use sqlx::PgPool;

use super::StoreError;
use crate::configuration::MembershipSettings;

/// The gate: see the module docs. Cheap to clone.
#[derive(Clone)]
pub struct Members(Arc<Inner>);

struct Inner {
    ttl: Duration,
    known: Mutex<LruCache<(i64, i64), Instant>>,
}

impl Members {
    pub fn new(settings: MembershipSettings) -> Self {
        let entries = NonZeroUsize::new(settings.cache_max_entries).unwrap_or(NonZeroUsize::MIN);
        Self(Arc::new(Inner {
            ttl: Duration::from_millis(settings.cache_ttl_ms),
            known: Mutex::new(LruCache::new(entries)),
        }))
    }

    /// `Ok` when `user` is a member of `conversation`; the not-found error otherwise.
    pub async fn require(
        &self,
        pool: &PgPool,
        conversation: ConversationId,
        user: UserId,
    ) -> Result<(), StoreError> {
        let key = (conversation.get(), user.get());
        let fresh = {
            let mut known = self.0.known.lock().expect("members lock");
            known.get(&key).is_some_and(|at| at.elapsed() < self.0.ttl)
        };
        if fresh {
            metrics::counter!("member_checks_total", "result" => "cached").increment(1);
            return Ok(());
        }
        let member: bool = sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM conversation_member
                             WHERE conversation_id = $1 AND user_id = $2)",
        )
        .bind(key.0)
        .bind(key.1)
        .fetch_one(pool)
        .await?;
        if !member {
            metrics::counter!("member_checks_total", "result" => "refused").increment(1);
            return Err(StoreError::conversation_not_found());
        }
        metrics::counter!("member_checks_total", "result" => "member").increment(1);
        let mut known = self.0.known.lock().expect("members lock");
        known.put(key, Instant::now());
        metrics::gauge!("member_cache_entries").set(known.len() as f64);
        Ok(())
    }

    /// `user` left or was removed here: not trusted from the cache any more.
    pub fn forget(&self, conversation: ConversationId, user: UserId) {
        let mut known = self.0.known.lock().expect("members lock");
        known.pop(&(conversation.get(), user.get()));
    }
}
