//! Who is connected: user -> sessions (one per device), each with a bounded queue of
//! frames. Pushing never waits: a full queue closes that one connection instead of
//! slowing the pusher (and so everyone else).

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use chatpipe_core::UserId;
use tokio::sync::{mpsc, Notify};

pub type SessionId = u64;

/// What a connection is told to do.
#[derive(Debug, Clone, PartialEq)]
pub enum Outbound {
    /// A JSON text frame, and when its event was committed (microseconds since the
    /// epoch) if it has one: the push latency is measured from there to the frame written.
    Frame(Arc<str>, Option<i64>),
    /// Close with this reason: the queue overflowed.
    Overflowed,
}

#[derive(Debug, Default)]
struct Inner {
    by_user: HashMap<UserId, Vec<(SessionId, mpsc::Sender<Outbound>)>>,
    /// Users whose session count changed since presence last looked.
    changed: HashSet<UserId>,
}

/// The registry is cheap to clone; all clones share one table.
#[derive(Debug, Clone)]
pub struct Sessions {
    inner: Arc<Mutex<Inner>>,
    next_id: Arc<AtomicU64>,
    queue_bound: usize,
    changes: Arc<Notify>,
}

/// A connected session: its id, and the receiving end of its queue. Dropping the
/// handle does not unregister; call [`Sessions::leave`].
pub struct Session {
    pub id: SessionId,
    pub user: UserId,
    pub outbound: mpsc::Receiver<Outbound>,
}

impl Sessions {
    pub fn new(queue_bound: usize) -> Self {
        Self {
            inner: Arc::default(),
            next_id: Arc::default(),
            queue_bound: queue_bound.max(1),
            changes: Arc::default(),
        }
    }

    pub fn join(&self, user: UserId) -> Session {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        // One slot more than the bound for the overflow notice itself.
        let (tx, rx) = mpsc::channel(self.queue_bound + 1);
        let mut inner = self.inner.lock().expect("sessions lock");
        inner.by_user.entry(user).or_default().push((id, tx));
        inner.changed.insert(user);
        self.changes.notify_one();
        metrics::gauge!("gateway_connections").increment(1.0);
        Session {
            id,
            user,
            outbound: rx,
        }
    }

    pub fn leave(&self, user: UserId, id: SessionId) {
        let mut guard = self.inner.lock().expect("sessions lock");
        let inner = &mut *guard;
        if let Some(list) = inner.by_user.get_mut(&user) {
            let before = list.len();
            list.retain(|(sid, _)| *sid != id);
            if list.len() < before {
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
        let frame: Arc<str> = Arc::from(frame);
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
                if tx
                    .try_send(Outbound::Frame(frame.clone(), committed_at))
                    .is_ok()
                {
                    delivered += 1;
                }
            }
        }
        metrics::counter!("gateway_pushes_total").increment(delivered as u64);
        delivered
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_push_reaches_every_session_of_the_user_and_nobody_else() {
        let sessions = Sessions::new(8);
        let mut phone = sessions.join(UserId::of(10));
        let mut laptop = sessions.join(UserId::of(10));
        let mut stranger = sessions.join(UserId::of(99));
        assert_eq!(
            sessions.push(&[UserId::of(10)], r#"{"type":"message.new"}"#),
            2
        );
        assert_eq!(
            phone.outbound.recv().await,
            Some(Outbound::Frame(
                Arc::from(r#"{"type":"message.new"}"#),
                None
            ))
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
        let mut slow = sessions.join(UserId::of(1));
        let mut fast = sessions.join(UserId::of(2));
        for i in 0..5 {
            sessions.push(&[UserId::of(1), UserId::of(2)], &format!("{i}"));
            // The fast client keeps up.
            assert!(matches!(
                fast.outbound.recv().await,
                Some(Outbound::Frame(..))
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
    async fn leaving_unregisters() {
        let sessions = Sessions::new(2);
        let s = sessions.join(UserId::of(5));
        sessions.leave(UserId::of(5), s.id);
        assert!(sessions.online().is_empty());
        assert_eq!(sessions.push(&[UserId::of(5)], "x"), 0);
    }
}
