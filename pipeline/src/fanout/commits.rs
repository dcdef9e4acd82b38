//! Fanout's offsets: a chat.events offset may be committed only once every fanout list
//! produced for the records before it is acknowledged by the broker. Lists are numbered
//! as they are produced; each offset snapshot remembers how many lists came before it,
//! and is released when none of those is still waiting. The loop never blocks on the
//! broker (a blocking flush every tick stalled it for up to 250 ms).

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use chatpipe_core::kafka::Rebootstrap;
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

/// Delivery reports: each list leaves the unacked set. A list the broker refused after
/// `message.timeout.ms` (a gateway partition that does not exist) is counted and
/// dropped: pushes are best effort, clients catch up over REST.
pub struct DeliveryReport {
    pub unacked: Arc<Unacked>,
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
        self.unacked.done(n as u64);
        if let Err((err, _)) = result {
            metrics::counter!("fanout_produce_errors_total").increment(1);
            tracing::warn!("a fanout list was not delivered: {err}");
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
