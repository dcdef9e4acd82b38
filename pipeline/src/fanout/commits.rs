//! Fanout's offsets: a chat.events offset may be committed only once every fanout list
//! produced for the records before it is acknowledged by the broker. Lists are numbered
//! as they are produced; each offset snapshot remembers how many lists came before it,
//! and is released when none of those is still waiting. The loop never blocks on the
//! broker (a blocking flush every tick stalled it for up to 250 ms).

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use chatpipe_core::kafka::Rebootstrap;
use chatpipe_schemas::ConversationId;
use rdkafka::producer::{DeliveryResult, ProducerContext};
use rdkafka::ClientContext;

/// Lists produced and not yet acknowledged, by number.
#[derive(Default)]
pub struct Unacked(Mutex<BTreeSet<u64>>);

impl Unacked {
    pub fn add(&self, n: u64) {
        self.0.lock().expect("unacked lock").insert(n);
    }

    pub fn done(&self, n: u64) {
        self.0.lock().expect("unacked lock").remove(&n);
    }

    /// The oldest list still waiting, and how many wait.
    pub fn oldest(&self) -> (Option<u64>, usize) {
        let set = self.0.lock().expect("unacked lock");
        (set.first().copied(), set.len())
    }
}

/// A changelog entry (or tombstone) of a conversation, produced as record `n`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChangelogWrite {
    pub conversation: ConversationId,
    pub partition: i32,
    /// Earlier numbers whose writes the broker refused and this one writes again: they
    /// stay unacknowledged (holding every offset after them) until this one is acked.
    pub covers: Vec<u64>,
}

/// What a delivery report was for.
#[derive(Debug, PartialEq, Eq)]
pub enum Delivered {
    /// A fanout list (or anything not a changelog write): done either way.
    List,
    /// A changelog write the broker acknowledged: these numbers are done.
    Changelog(Vec<u64>),
    /// A changelog write the broker refused: nothing is done; it is written again.
    Refused(ConversationId),
}

/// Changelog writes in flight, and those the broker refused. An entry is never
/// dropped: a refused one is written again (the conversation's entry as it is then) on
/// the next tick, and the offsets after it wait until a write of it is acknowledged. A
/// lost tombstone or entry would leave the compacted changelog with a member list that a
/// restore trusts.
#[derive(Default)]
pub struct ChangelogWrites(Mutex<ChangelogState>);

#[derive(Default)]
struct ChangelogState {
    in_flight: HashMap<u64, ChangelogWrite>,
    refused: Vec<ChangelogWrite>,
}

impl ChangelogWrites {
    /// Record `n` is the write `w` (call before producing it).
    pub fn sent(&self, n: u64, w: ChangelogWrite) {
        self.0
            .lock()
            .expect("changelog lock")
            .in_flight
            .insert(n, w);
    }

    /// Record `n` was not produced after all (the producer refused it at once): `w`'s
    /// covered numbers go back to be written again.
    pub fn unsent(&self, n: u64) -> Option<ChangelogWrite> {
        self.0.lock().expect("changelog lock").in_flight.remove(&n)
    }

    /// The broker's answer for record `n`.
    pub fn delivered(&self, n: u64, ok: bool) -> Delivered {
        let mut state = self.0.lock().expect("changelog lock");
        let Some(mut w) = state.in_flight.remove(&n) else {
            return Delivered::List;
        };
        w.covers.push(n);
        if ok {
            Delivered::Changelog(w.covers)
        } else {
            let conversation = w.conversation;
            state.refused.push(w);
            Delivered::Refused(conversation)
        }
    }

    /// The refused writes, to be written again.
    pub fn take_refused(&self) -> Vec<ChangelogWrite> {
        std::mem::take(&mut self.0.lock().expect("changelog lock").refused)
    }
}

/// Delivery reports: each record leaves the unacked set. A list the broker refused after
/// `message.timeout.ms` (a gateway partition that does not exist) is counted and
/// dropped: pushes are best effort, clients catch up over REST. A changelog write is
/// never dropped ([`ChangelogWrites`]).
pub struct DeliveryReport {
    pub unacked: Arc<Unacked>,
    pub changelog: Arc<ChangelogWrites>,
    pub rebootstrap: Rebootstrap,
}

impl ClientContext for DeliveryReport {
    fn stats(&self, statistics: rdkafka::Statistics) {
        self.rebootstrap.observe(&statistics);
    }
}

impl ProducerContext for DeliveryReport {
    type DeliveryOpaque = usize;

    fn delivery(&self, result: &DeliveryResult<'_>, n: usize) {
        match self.changelog.delivered(n as u64, result.is_ok()) {
            Delivered::List => {
                self.unacked.done(n as u64);
                if let Err((err, _)) = result {
                    metrics::counter!("fanout_produce_errors_total").increment(1);
                    tracing::warn!("a fanout list was not delivered: {err}");
                }
            }
            Delivered::Changelog(done) => done.into_iter().for_each(|d| self.unacked.done(d)),
            Delivered::Refused(conversation) => {
                metrics::counter!("fanout_changelog_refused_total").increment(1);
                if let Err((err, _)) = result {
                    tracing::warn!(%conversation, "changelog entry refused ({err}): written again, offsets held");
                }
            }
        }
    }
}

/// Offsets read, waiting for their lists' acks.
#[derive(Default)]
pub struct PendingOffsets {
    /// The next offset per partition since the last snapshot.
    current: HashMap<i32, i64>,
    /// (lists produced before them, offsets), oldest first.
    snapshots: VecDeque<(u64, HashMap<i32, i64>)>,
}

impl PendingOffsets {
    /// The record at `offset` of `partition` is fanned out (its lists produced).
    pub fn read(&mut self, partition: i32, offset: i64) {
        self.current.insert(partition, offset + 1);
    }

    /// Closes the current snapshot: it waits for the `lists_before` lists produced so far.
    pub fn snapshot(&mut self, lists_before: u64) {
        if !self.current.is_empty() {
            self.snapshots
                .push_back((lists_before, std::mem::take(&mut self.current)));
        }
    }

    /// The partitions went to another member: their offsets are not ours to commit.
    pub fn forget(&mut self, partitions: &[i32]) {
        self.current.retain(|p, _| !partitions.contains(p));
        for (_, offsets) in &mut self.snapshots {
            offsets.retain(|p, _| !partitions.contains(p));
        }
    }

    /// The offsets of the snapshots whose lists are all acknowledged (`oldest`: the
    /// oldest list still waiting), merged to the highest per partition.
    pub fn releasable(&mut self, oldest: Option<u64>) -> HashMap<i32, i64> {
        let mut ready: HashMap<i32, i64> = HashMap::new();
        while let Some((before, _)) = self.snapshots.front() {
            if oldest.is_some_and(|o| o < *before) {
                break;
            }
            let (_, offsets) = self.snapshots.pop_front().expect("front exists");
            for (p, o) in offsets {
                let e = ready.entry(p).or_insert(o);
                *e = (*e).max(o);
            }
        }
        ready
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_wait_for_every_older_list_and_merge_to_the_highest() {
        let mut pending = PendingOffsets::default();
        // Snapshot A after lists 0..3, snapshot B after lists 0..5.
        pending.read(0, 9);
        pending.read(1, 3);
        pending.snapshot(3);
        pending.read(0, 11);
        pending.snapshot(5);
        // List 2 is still out: nothing may be committed.
        assert!(pending.releasable(Some(2)).is_empty());
        // Lists 0..3 acknowledged (4 is out): A only.
        assert_eq!(
            pending.releasable(Some(4)),
            HashMap::from([(0, 10), (1, 4)])
        );
        // Everything acknowledged.
        assert_eq!(pending.releasable(None), HashMap::from([(0, 12)]));
        assert!(pending.releasable(None).is_empty());
    }

    #[test]
    fn a_refused_changelog_write_stays_unacked_until_its_rewrite_is_acked() {
        let writes = ChangelogWrites::default();
        let c = ConversationId::of(7);
        let write = |covers| ChangelogWrite {
            conversation: c,
            partition: 2,
            covers,
        };
        writes.sent(3, write(vec![]));
        assert_eq!(writes.delivered(4, true), Delivered::List);
        assert_eq!(writes.delivered(3, false), Delivered::Refused(c));
        let refused = writes.take_refused();
        assert_eq!(refused, vec![write(vec![3])]);
        // Written again as 9, refused again, then 12 is acknowledged: 3, 9 and 12 are done.
        writes.sent(9, refused[0].clone());
        assert_eq!(writes.delivered(9, false), Delivered::Refused(c));
        writes.sent(12, writes.take_refused().remove(0));
        assert_eq!(
            writes.delivered(12, true),
            Delivered::Changelog(vec![3, 9, 12])
        );
        assert!(writes.take_refused().is_empty());
    }

    #[test]
    fn revoked_partitions_are_never_released() {
        let mut pending = PendingOffsets::default();
        pending.read(0, 1);
        pending.read(1, 1);
        pending.snapshot(0);
        pending.read(1, 2);
        pending.forget(&[1]);
        pending.snapshot(0);
        assert_eq!(pending.releasable(None), HashMap::from([(0, 2)]));
    }
}
