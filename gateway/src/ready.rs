//! `ready`: when a new session's pushes are live (docs/protocol.md).
//!
//! Fanout pushes to a user only once its presence table holds them, and every fanout
//! member reads chat.presence on its own. So a session waits for two things:
//! 1. **its presence record**: the first record of its user that this gateway wrote
//!    after the session joined, acknowledged by the broker at (partition, offset);
//! 2. **the members that applied it**: each fanout member tells this gateway how far it
//!    has applied chat.presence and which chat.events partitions it joins (a
//!    `presence.applied` list). Once the members whose tables hold the record together
//!    join every partition, each event committed from then on is fanned out by a member
//!    that holds the user (a member taking a partition over applies chat.presence first,
//!    `pipeline::fanout::presence::catch_up_now`).
//!
//! Then the session is told `{"type":"ready"}` and the client catches up once.

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use chatpipe_core::UserId;
use chatpipe_schemas::delivery::PresenceApplied;
use tokio::time::Instant;

use crate::sessions::SessionId;

/// A fanout member's `presence.applied` not renewed for this long is forgotten (the
/// member is gone; a member of a quiet gateway sends one with every lease renewal).
const FORGET_MEMBER_AFTER: Duration = Duration::from_secs(600);

/// A session that is now ready: who, and how long since it joined.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ready {
    pub user: UserId,
    pub session: SessionId,
    pub waited: Duration,
}

#[derive(Debug, Clone)]
struct Waiting {
    user: UserId,
    session: SessionId,
    joined: Instant,
    partition: i32,
    offset: i64,
}

/// Sessions waiting for `ready`, and what the fanout members have applied.
#[derive(Debug, Default)]
pub struct ReadyTable {
    /// Sessions whose presence record is not yet written and acknowledged.
    unplaced: HashMap<UserId, Vec<(SessionId, Instant)>>,
    /// Sessions whose record is at (partition, offset): waiting for the members.
    placed: Vec<Waiting>,
    /// Each member's latest `presence.applied`, and when it came.
    members: HashMap<String, (PresenceApplied, Instant)>,
}

/// Sessions taken for one presence write (see [`ReadyTable::claim`]).
pub type Claimed = Vec<(UserId, Vec<(SessionId, Instant)>)>;

impl ReadyTable {
    pub fn joined(&mut self, user: UserId, session: SessionId, now: Instant) {
        self.unplaced.entry(user).or_default().push((session, now));
    }

    pub fn left(&mut self, user: UserId, session: SessionId) {
        if let Some(list) = self.unplaced.get_mut(&user) {
            list.retain(|(s, _)| *s != session);
            if list.is_empty() {
                self.unplaced.remove(&user);
            }
        }
        self.placed.retain(|w| w.session != session);
    }

    /// How many sessions wait.
    pub fn waiting(&self) -> usize {
        self.unplaced.values().map(Vec::len).sum::<usize>() + self.placed.len()
    }

    /// Takes the unplaced sessions of `users`, about to get a presence record each:
    /// the record is written after they joined. Call before the write.
    pub fn claim(&mut self, users: &[UserId]) -> Claimed {
        users
            .iter()
            .filter_map(|u| self.unplaced.remove(u).map(|s| (*u, s)))
            .collect()
    }

    /// The record of `user` is at (`partition`, `offset`): its claimed sessions wait for
    /// the members. Answers those that are ready already.
    pub fn place(
        &mut self,
        user: UserId,
        sessions: Vec<(SessionId, Instant)>,
        (partition, offset): (i32, i64),
        now: Instant,
    ) -> Vec<Ready> {
        self.placed
            .extend(sessions.into_iter().map(|(session, joined)| Waiting {
                user,
                session,
                joined,
                partition,
                offset,
            }));
        self.take_ready(now)
    }

    /// The record was not acknowledged: the sessions wait for the next one.
    pub fn unclaim(&mut self, user: UserId, sessions: Vec<(SessionId, Instant)>) {
        self.unplaced.entry(user).or_default().extend(sessions);
    }

    /// A member's `presence.applied`: answers the sessions now ready.
    pub fn applied(&mut self, ack: PresenceApplied, now: Instant) -> Vec<Ready> {
        self.members
            .retain(|_, (_, at)| now.saturating_duration_since(*at) < FORGET_MEMBER_AFTER);
        self.members.insert(ack.member.clone(), (ack, now));
        self.take_ready(now)
    }

    fn take_ready(&mut self, now: Instant) -> Vec<Ready> {
        let mut ready = Vec::new();
        let members = &self.members;
        self.placed.retain(|w| {
            let live = covered(members.values().map(|(a, _)| a), w.partition, w.offset);
            if live {
                ready.push(Ready {
                    user: w.user,
                    session: w.session,
                    waited: now.saturating_duration_since(w.joined),
                });
            }
            !live
        });
        ready
    }
}

/// Whether the members that applied the record at (`partition`, `offset`) together join
/// every partition of chat.events.
fn covered<'a>(
    members: impl Iterator<Item = &'a PresenceApplied>,
    partition: i32,
    offset: i64,
) -> bool {
    let mut count = 0;
    let mut joined = BTreeSet::new();
    for m in members {
        count = count.max(m.event_partition_count);
        let holds = m
            .applied
            .iter()
            .any(|(p, next)| *p == partition && *next > offset);
        if holds {
            joined.extend(m.event_partitions.iter().copied());
        }
    }
    count > 0 && (0..count).all(|p| joined.contains(&p))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ack(member: &str, applied: &[(i32, i64)], joins: &[i32]) -> PresenceApplied {
        PresenceApplied {
            member: member.into(),
            applied: applied.to_vec(),
            event_partitions: joins.to_vec(),
            event_partition_count: 3,
        }
    }

    #[test]
    fn a_session_is_ready_once_the_members_holding_its_record_join_every_partition() {
        let now = Instant::now();
        let mut t = ReadyTable::default();
        let user = UserId::of(7);
        t.joined(user, 1, now);
        let claimed = t.claim(&[user]);
        assert_eq!(claimed.len(), 1);
        // A member that has applied up to the record (next = 10 is the record itself)
        // does not hold it yet.
        assert!(t.applied(ack("a", &[(2, 10)], &[0, 1]), now).is_empty());
        for (u, s) in claimed {
            assert!(t.place(u, s, (2, 10), now).is_empty());
        }
        assert!(
            t.applied(ack("a", &[(2, 11)], &[0, 1]), now).is_empty(),
            "partition 2 is not covered"
        );
        assert!(
            t.applied(ack("b", &[(1, 500)], &[2]), now).is_empty(),
            "b applied another partition of chat.presence, not the record's"
        );
        let ready = t.applied(ack("b", &[(1, 500), (2, 12)], &[2]), now);
        assert_eq!(ready.iter().map(|r| r.session).collect::<Vec<_>>(), vec![1]);
        assert_eq!(t.waiting(), 0);
    }

    #[test]
    fn sessions_wait_for_a_record_written_after_they_joined() {
        let now = Instant::now();
        let mut t = ReadyTable::default();
        let user = UserId::of(7);
        t.applied(ack("a", &[(0, 100)], &[0, 1, 2]), now);
        let early = t.claim(&[user]);
        assert!(
            early.is_empty(),
            "nobody waited when that record was written"
        );
        t.joined(user, 4, now);
        assert_eq!(t.waiting(), 1, "an older record does not count");
        // The write failed: the session waits for the next record.
        for (u, s) in t.claim(&[user]) {
            t.unclaim(u, s);
        }
        for (u, s) in t.claim(&[user]) {
            let ready = t.place(u, s, (0, 99), now);
            assert_eq!(
                ready.len(),
                1,
                "members that applied it already: ready at once"
            );
        }
    }

    #[test]
    fn a_session_that_left_is_not_waited_for() {
        let now = Instant::now();
        let mut t = ReadyTable::default();
        t.joined(UserId::of(1), 1, now);
        t.joined(UserId::of(1), 2, now);
        for (u, s) in t.claim(&[UserId::of(1)]) {
            t.place(u, s, (0, 5), now);
        }
        t.left(UserId::of(1), 1);
        let ready = t.applied(ack("a", &[(0, 6)], &[0, 1, 2]), now);
        assert_eq!(ready.iter().map(|r| r.session).collect::<Vec<_>>(), vec![2]);
    }
}
