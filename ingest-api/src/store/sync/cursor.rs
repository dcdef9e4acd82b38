//! Sync cursors: what a sync hands out to be passed back as `since`, signed with
//! HMAC-SHA256 (a key kept in the database) over the user and the payload, so a cursor
//! this API did not hand to this user is refused, and so is one changed on the way.
//!
//! Two kinds travel the same way, `<payload>.<signature>`, both base64url:
//! - a finished sync's **snapshot** (`pg_current_snapshot()` as PostgreSQL prints it);
//! - a **continuation**, for a sync that did not fit one answer: where it started, the
//!   snapshot of its first answer, and the conversations still to come (JSON).

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use chatpipe_core::UserId;
use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use sha2::Sha256;
use sqlx::PgPool;

/// Signs and checks sync cursors.
#[derive(Clone)]
pub struct CursorKey(Hmac<Sha256>);

/// A checked cursor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cursor {
    /// Everything this snapshot saw was reported: the next sync reports what it did not.
    Snapshot(String),
    /// The rest of a sync that did not fit one answer.
    Continue(Continuation),
}

/// Where a sync that took more than one answer goes on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Continuation {
    /// The snapshot the sync started from; `None` for an initial sync.
    pub since: Option<String>,
    /// The snapshot of the sync's first answer: later answers report only what it saw,
    /// and the sync's last answer hands it out as the next cursor.
    pub upto: String,
    /// What is still to come: the conversations of this part with an id below `before`.
    pub part: Part,
    pub before: i64,
}

/// A sync reports the caller's conversations first, then those they left.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Part {
    Members,
    Departed,
}

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

    fn mac(&self, user: UserId, payload: &str) -> Hmac<Sha256> {
        let mut mac = self.0.clone();
        mac.update(format!("{}\n{payload}", user.get()).as_bytes());
        mac
    }

    /// `<payload>.<signature>`, both base64url.
    pub fn seal(&self, user: UserId, cursor: &Cursor) -> String {
        let payload = match cursor {
            Cursor::Snapshot(snapshot) => snapshot.clone(),
            Cursor::Continue(rest) => {
                serde_json::to_string(rest).expect("a continuation serializes")
            }
        };
        let signature = self.mac(user, &payload).finalize().into_bytes();
        format!(
            "{}.{}",
            URL_SAFE_NO_PAD.encode(&payload),
            URL_SAFE_NO_PAD.encode(signature)
        )
    }

    /// The cursor in `raw`, if this key sealed it for `user`.
    pub fn open(&self, user: UserId, raw: &str) -> Option<Cursor> {
        let (payload, signature) = raw.split_once('.')?;
        let payload = String::from_utf8(URL_SAFE_NO_PAD.decode(payload).ok()?).ok()?;
        let signature = URL_SAFE_NO_PAD.decode(signature).ok()?;
        self.mac(user, &payload).verify_slice(&signature).ok()?;
        // A snapshot starts with a digit (`xmin:xmax:xip,...`), a continuation with `{`.
        if payload.starts_with('{') {
            serde_json::from_str(&payload).ok().map(Cursor::Continue)
        } else {
            Some(Cursor::Snapshot(payload))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cursor_opens_only_for_its_user_and_unchanged() {
        let key = CursorKey::new(b"0123456789abcdef0123456789abcdef");
        let (alice, bob) = (UserId::new(10).unwrap(), UserId::new(20).unwrap());
        let snapshot = Cursor::Snapshot("780:790:781,785".into());
        let rest = Cursor::Continue(Continuation {
            since: Some("700:700:".into()),
            upto: "780:790:781,785".into(),
            part: Part::Departed,
            before: 42,
        });
        for cursor in [snapshot, rest] {
            let sealed = key.seal(alice, &cursor);
            assert_eq!(key.open(alice, &sealed), Some(cursor.clone()));
            assert_eq!(key.open(bob, &sealed), None, "another user's cursor");
            let other = CursorKey::new(b"another key, another deployment!");
            assert_eq!(other.open(alice, &sealed), None, "another key");
            let (_, signature) = sealed.split_once('.').unwrap();
            let forged = format!("{}.{signature}", URL_SAFE_NO_PAD.encode("1:2:"));
            assert_eq!(key.open(alice, &forged), None, "a changed payload");
        }
        for garbage in ["", ".", "abc", "abc.def", "!!.!!"] {
            assert_eq!(key.open(alice, garbage), None, "{garbage:?}");
        }
    }
}
