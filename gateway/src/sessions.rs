//! Who is connected: user -> sessions (one per device), each with a bounded queue of
//! frames. Pushing never waits: a full queue closes that one connection instead of
//! slowing the pusher (and so everyone else).

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use chatpipe_core::UserId;
use chatpipe_schemas::delivery::PresenceApplied;
use tokio::sync::{mpsc, Notify};
use tokio::time::Instant;

use crate::frames::Frame;
use crate::ready::{Claimed, Ready, ReadyTable};

pub type SessionId = u64;

/// A frame and when its event was committed (microseconds since the epoch) if it has
/// one: the push latency is measured from there to the frame written.
#[derive(Debug, PartialEq, Eq)]
pub struct Pushed {
    pub text: Box<str>,
    pub committed_at: Option<i64>,
}

/// What a connection is told to do.
#[derive(Debug, Clone, PartialEq)]
pub enum Outbound {
    /// A JSON text frame, encoded once for all its recipients. A pointer: a queue
    /// allocates its first 32 slots when it is made, so the slot's size is part of what
    /// every idle connection costs.
    Frame(Arc<Pushed>),
    /// Close with this reason: the queue overflowed.
    Overflowed,
    /// Close: a newer session of the same user took this one's place
    /// (`sessions.max_sessions_per_user`).
    Replaced,
}

// A slot stays two words: the pointer and the variant (see `Outbound::Frame`).
const _: () = assert!(std::mem::size_of::<Outbound>() == 2 * std::mem::size_of::<usize>());

/// The gateway holds `sessions.max_sessions` sessions already: a new one is refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("the gateway holds its maximum of {0} sessions")]
pub struct AtCapacity(pub usize);

#[derive(Debug, Default)]
struct Inner {
    /// Each user's sessions, oldest first.
    by_user: HashMap<UserId, Vec<(SessionId, mpsc::Sender<Outbound>)>>,
    total: usize,
    /// Users whose session count changed since presence last looked.
    changed: HashSet<UserId>,
    /// Sessions not yet told `ready`.
    ready: ReadyTable,
}

/// The registry is cheap to clone; all clones share one table.
#[derive(Debug, Clone)]
pub struct Sessions {
    inner: Arc<Mutex<Inner>>,
    next_id: Arc<AtomicU64>,
    queue_bound: usize,
    max_sessions: usize,
    max_per_user: usize,
    changes: Arc<Notify>,
}

/// A connected session: its id, and the receiving end of its queue. Dropping the
/// handle does not unregister; call [`Sessions::leave`].
pub struct Session {
    pub id: SessionId,
    pub user: UserId,
    pub outbound: mpsc::Receiver<Outbound>,
    /// When the token it connected with expires: the connection closes then.
    pub token_expires: Option<tokio::time::Instant>,
}

impl Sessions {
    pub fn new(queue_bound: usize) -> Self {
        Self {
            inner: Arc::default(),
            next_id: Arc::default(),
            queue_bound: queue_bound.max(1),
            max_sessions: usize::MAX,
            max_per_user: usize::MAX,
            changes: Arc::default(),
        }
    }

    /// At most `max_sessions` sessions here (a new one past that is refused) and
    /// `max_per_user` per user (a new one past that replaces the user's oldest).
    pub fn with_caps(mut self, max_sessions: usize, max_per_user: usize) -> Self {
        self.max_sessions = max_sessions.max(1);
        self.max_per_user = max_per_user.max(1);
        self
    }

    /// Registers a session of `user`. A user at `max_per_user` loses their oldest
    /// session (told [`Outbound::Replaced`], and no longer pushed to); a gateway at
    /// `max_sessions` refuses.
    pub fn join(&self, user: UserId) -> Result<Session, AtCapacity> {
        let mut guard = self.inner.lock().expect("sessions lock");
        let inner = &mut *guard;
        let list = inner.by_user.entry(user).or_default();
        let replaces = list.len() >= self.max_per_user;
        if !replaces && inner.total >= self.max_sessions {
            if list.is_empty() {
                inner.by_user.remove(&user);
            }
            metrics::counter!("gateway_sessions_refused_total").increment(1);
            return Err(AtCapacity(self.max_sessions));
        }
        if replaces {
            let (oldest_id, oldest) = list.remove(0);
            inner.ready.left(user, oldest_id);
            // Its queue may be full (then it is closing for overflow anyway); with its
            // sender gone it ends once it has drained what is queued.
            let _ = oldest.try_send(Outbound::Replaced);
            metrics::counter!("gateway_sessions_replaced_total").increment(1);
        } else {
            inner.total += 1;
            metrics::gauge!("gateway_connections").increment(1.0);
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        // One slot more than the bound for the overflow notice itself.
        let (tx, rx) = mpsc::channel(self.queue_bound + 1);
        list.push((id, tx));
        inner.ready.joined(user, id, Instant::now());
        metrics::gauge!("gateway_sessions_awaiting_ready").set(inner.ready.waiting() as f64);
        inner.changed.insert(user);
        self.changes.notify_one();
        Ok(Session {
            id,
            user,
            outbound: rx,
            token_expires: None,
        })
    }

    pub fn leave(&self, user: UserId, id: SessionId) {
        let mut guard = self.inner.lock().expect("sessions lock");
        let inner = &mut *guard;
        if let Some(list) = inner.by_user.get_mut(&user) {
            let before = list.len();
            list.retain(|(sid, _)| *sid != id);
            inner.ready.left(user, id);
            if list.len() < before {
                inner.total -= 1;
                metrics::gauge!("gateway_connections").decrement(1.0);
                inner.changed.insert(user);
                self.changes.notify_one();
            }
            if list.is_empty() {
                inner.by_user.remove(&user);
            }
        }
    }

    /// Users with at least one session here.
    pub fn online(&self) -> Vec<UserId> {
        self.inner
            .lock()
            .expect("sessions lock")
            .by_user
            .keys()
            .copied()
            .collect()
    }

    /// Waits until some user's session count changes.
    pub async fn changed(&self) {
        self.changes.notified().await;
    }

    /// The users whose session count changed since the last call, with their count now
    /// (0: gone).
    pub fn take_changes(&self) -> Vec<(UserId, usize)> {
        let mut inner = self.inner.lock().expect("sessions lock");
        let changed = std::mem::take(&mut inner.changed);
        changed
            .into_iter()
            .map(|u| (u, inner.by_user.get(&u).map_or(0, Vec::len)))
            .collect()
    }

    /// Every user here with their session count.
    pub fn counts(&self) -> Vec<(UserId, usize)> {
        let inner = self.inner.lock().expect("sessions lock");
        inner.by_user.iter().map(|(u, s)| (*u, s.len())).collect()
    }

    /// Takes the sessions of `users` still waiting for a presence record: this gateway is
    /// about to write one for each (see [`crate::ready`]).
    pub fn claim_ready(&self, users: &[UserId]) -> Claimed {
        self.inner.lock().expect("sessions lock").ready.claim(users)
    }

    /// The presence record of `user` written for `sessions` was acknowledged at
    /// (partition, offset), or (`None`) not: then they wait for the next one.
    pub fn presence_written(
        &self,
        user: UserId,
        sessions: Vec<(SessionId, Instant)>,
        at: Option<(i32, i64)>,
    ) {
        let mut inner = self.inner.lock().expect("sessions lock");
        match at {
            Some(at) => {
                let ready = inner.ready.place(user, sessions, at, Instant::now());
                send_ready(&mut inner, ready);
            }
            None => inner.ready.unclaim(user, sessions),
        }
    }

    /// A fanout member's `presence.applied`: tells the sessions it makes ready.
    pub fn presence_applied(&self, ack: PresenceApplied) {
        let mut inner = self.inner.lock().expect("sessions lock");
        let ready = inner.ready.applied(ack, Instant::now());
        send_ready(&mut inner, ready);
    }

    /// Queues `frame` for every session of every user in `users`; returns how many
    /// sessions got it. A session whose queue is full is told to close.
    pub fn push(&self, users: &[UserId], frame: &str) -> usize {
        self.push_committed(users, frame, None)
    }

    /// [`Sessions::push`] for an event committed at `committed_at` (microseconds since
    /// the epoch).
    pub fn push_committed(
        &self,
        users: &[UserId],
        frame: &str,
        committed_at: Option<i64>,
    ) -> usize {
        let frame = Arc::new(Pushed {
            text: frame.into(),
            committed_at,
        });
        let inner = self.inner.lock().expect("sessions lock");
        let mut delivered = 0;
        for user in users {
            for (_, tx) in inner.by_user.get(user).into_iter().flatten() {
                if tx.capacity() <= 1 {
                    // The last slot is reserved for the overflow notice.
                    if tx.try_send(Outbound::Overflowed).is_ok() {
                        metrics::counter!("gateway_queue_overflows_total").increment(1);
                    }
                    continue;
                }
                if tx.try_send(Outbound::Frame(frame.clone())).is_ok() {
                    delivered += 1;
                }
            }
        }
        metrics::counter!("gateway_pushes_total").increment(delivered as u64);
        delivered
    }
}

/// Queues `ready` for each of `ready`'s sessions still here.
fn send_ready(inner: &mut Inner, ready: Vec<Ready>) {
    metrics::gauge!("gateway_sessions_awaiting_ready").set(inner.ready.waiting() as f64);
    if ready.is_empty() {
        return;
    }
    let frame = Arc::new(Pushed {
        text: Frame::ready().text().into(),
        committed_at: None,
    });
    for r in ready {
        let session = inner
            .by_user
            .get(&r.user)
            .and_then(|list| list.iter().find(|(id, _)| *id == r.session));
        if let Some((_, tx)) = session {
            // A full queue is closing for overflow already.
            if tx.try_send(Outbound::Frame(frame.clone())).is_ok() {
                metrics::histogram!("gateway_ready_seconds").record(r.waited.as_secs_f64());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_push_reaches_every_session_of_the_user_and_nobody_else() {
        let sessions = Sessions::new(8);
        let mut phone = sessions.join(UserId::of(10)).unwrap();
        let mut laptop = sessions.join(UserId::of(10)).unwrap();
        let mut stranger = sessions.join(UserId::of(99)).unwrap();
        assert_eq!(
            sessions.push(&[UserId::of(10)], r#"{"type":"message.new"}"#),
            2
        );
        assert_eq!(
            phone.outbound.recv().await,
            Some(Outbound::Frame(Arc::new(Pushed {
                text: r#"{"type":"message.new"}"#.into(),
                committed_at: None
            })))
        );
        assert!(laptop.outbound.recv().await.is_some());
        assert!(
            stranger.outbound.try_recv().is_err(),
            "a non-recipient gets nothing"
        );
        let mut online = sessions.online();
        online.sort();
        assert_eq!(online, vec![UserId::of(10), UserId::of(99)]);
    }

    #[tokio::test]
    async fn a_full_queue_closes_that_session_only() {
        let sessions = Sessions::new(2);
        let mut slow = sessions.join(UserId::of(1)).unwrap();
        let mut fast = sessions.join(UserId::of(2)).unwrap();
        for i in 0..5 {
            sessions.push(&[UserId::of(1), UserId::of(2)], &format!("{i}"));
            // The fast client keeps up.
            assert!(matches!(
                fast.outbound.recv().await,
                Some(Outbound::Frame(_))
            ));
        }
        let mut got = Vec::new();
        while let Ok(o) = slow.outbound.try_recv() {
            got.push(o);
        }
        assert_eq!(
            got.len(),
            3,
            "two frames, then the overflow notice: {got:?}"
        );
        assert_eq!(got.last(), Some(&Outbound::Overflowed));
    }

    #[tokio::test]
    async fn past_the_per_user_cap_the_oldest_session_is_replaced_and_past_the_total_cap_a_new_one_is_refused(
    ) {
        let sessions = Sessions::new(8).with_caps(3, 2);
        let mut first = sessions.join(UserId::of(1)).unwrap();
        let mut second = sessions.join(UserId::of(1)).unwrap();
        let mut third = sessions.join(UserId::of(1)).unwrap();
        assert_eq!(first.outbound.recv().await, Some(Outbound::Replaced));
        assert_eq!(first.outbound.recv().await, None, "and nothing after");
        assert_eq!(sessions.counts(), vec![(UserId::of(1), 2)]);
        assert_eq!(sessions.push(&[UserId::of(1)], "x"), 2);
        assert!(second.outbound.recv().await.is_some());
        assert!(third.outbound.recv().await.is_some());
        let other = sessions.join(UserId::of(2)).unwrap();
        assert_eq!(sessions.join(UserId::of(3)).err(), Some(AtCapacity(3)));
        // A user at their own cap still replaces, even with the gateway full.
        assert!(sessions.join(UserId::of(1)).is_ok());
        assert_eq!(second.outbound.recv().await, Some(Outbound::Replaced));
        sessions.leave(UserId::of(2), other.id);
        assert!(sessions.join(UserId::of(3)).is_ok(), "room again");
    }

    #[tokio::test]
    async fn leaving_unregisters() {
        let sessions = Sessions::new(2);
        let s = sessions.join(UserId::of(5)).unwrap();
        sessions.leave(UserId::of(5), s.id);
        assert!(sessions.online().is_empty());
        assert_eq!(sessions.push(&[UserId::of(5)], "x"), 0);
    }
}
