//! Sync cursors: what a sync hands out to be passed back as `since`, signed with
//! HMAC-SHA256 (a key kept in the database) over the user and the payload, so a cursor
//! this API did not hand to this user is refused, and so is one changed on the way.
//!
//! Two kinds travel the same way, `<payload>.<signature>`, both base64url:
//! - a finished sync's **snapshot** (`pg_current_snapshot()` as PostgreSQL prints it),
//!   after its origin: `<origin>@<snapshot>`;
//! - a **continuation**, for a sync that did not fit one answer: where it started, the
//!   snapshot of its first answer, and the conversations still to come (JSON, with the
//!   origin in `origin`).
//!
//! **The origin** says which history of the database the snapshot is of:
//! `<system identifier>/<timeline>` (`pg_control_system()`, and the timeline of the WAL
//! being written). A snapshot's transaction ids mean something only on the server
//! history that handed it out: after a failover to a standby that was behind, or a
//! restore, the same ids name other transactions, and a delta read with the old snapshot
//! would skip changes silently. A promoted standby and a restore start a new timeline,
//! another cluster has another identifier: the cursor is then stale (409, and the client
//! syncs from the start). A cursor handed out before cursors carried an origin is stale
//! too: nothing says which history it is of.

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

/// A checked cursor and the origin it was handed out on (`None`: made before cursors
/// carried one).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Opened {
    pub origin: Option<String>,
    pub cursor: Cursor,
}

/// What a continuation travels as: the continuation and its origin.
#[derive(Serialize, Deserialize)]
struct Wire {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    origin: Option<String>,
    #[serde(flatten)]
    rest: Continuation,
}

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

    /// `<payload>.<signature>`, both base64url, for a cursor handed out on `origin`.
    pub fn seal(&self, user: UserId, origin: &str, cursor: &Cursor) -> String {
        let payload = match cursor {
            Cursor::Snapshot(snapshot) => format!("{origin}@{snapshot}"),
            Cursor::Continue(rest) => serde_json::to_string(&Wire {
                origin: Some(origin.to_owned()),
                rest: rest.clone(),
            })
            .expect("a continuation serializes"),
        };
        self.sign(user, &payload)
    }

    fn sign(&self, user: UserId, payload: &str) -> String {
        let signature = self.mac(user, payload).finalize().into_bytes();
        format!(
            "{}.{}",
            URL_SAFE_NO_PAD.encode(payload),
            URL_SAFE_NO_PAD.encode(signature)
        )
    }

    /// The cursor in `raw`, if this key sealed it for `user`.
    pub fn open(&self, user: UserId, raw: &str) -> Option<Opened> {
        let (payload, signature) = raw.split_once('.')?;
        let payload = String::from_utf8(URL_SAFE_NO_PAD.decode(payload).ok()?).ok()?;
        let signature = URL_SAFE_NO_PAD.decode(signature).ok()?;
        self.mac(user, &payload).verify_slice(&signature).ok()?;
        // A continuation is JSON; a snapshot is `<origin>@xmin:xmax:xip,...`, or without
        // the origin from before cursors carried one.
        if payload.starts_with('{') {
            let wire: Wire = serde_json::from_str(&payload).ok()?;
            return Some(Opened {
                origin: wire.origin,
                cursor: Cursor::Continue(wire.rest),
            });
        }
        let (origin, snapshot) = match payload.split_once('@') {
            Some((origin, snapshot)) => (Some(origin.to_owned()), snapshot),
            None => (None, payload.as_str()),
        };
        Some(Opened {
            origin,
            cursor: Cursor::Snapshot(snapshot.to_owned()),
        })
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
            let sealed = key.seal(alice, "7715132553894759253/2", &cursor);
            let opened = Opened {
                origin: Some("7715132553894759253/2".into()),
                cursor: cursor.clone(),
            };
            assert_eq!(key.open(alice, &sealed), Some(opened));
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

    #[test]
    fn a_cursor_from_before_origins_opens_without_one() {
        let key = CursorKey::new(b"0123456789abcdef0123456789abcdef");
        let alice = UserId::new(10).unwrap();
        let rest = r#"{"since":null,"upto":"780:790:","part":"members","before":42}"#;
        for (payload, cursor) in [
            ("780:790:781", Cursor::Snapshot("780:790:781".into())),
            (
                rest,
                Cursor::Continue(Continuation {
                    since: None,
                    upto: "780:790:".into(),
                    part: Part::Members,
                    before: 42,
                }),
            ),
        ] {
            let opened = key.open(alice, &key.sign(alice, payload));
            assert_eq!(
                opened,
                Some(Opened {
                    origin: None,
                    cursor
                })
            );
        }
    }
}
