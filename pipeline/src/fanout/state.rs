//! What the fanout processor keeps between records, apart from its effects: the
//! members it knows, the reads and deliveries it holds back, and the bookkeeping that
//! says which offsets may be committed. No I/O; [`super::events`] does the producing
//! and loading, and calls these.

use std::collections::{HashMap, HashSet};
use std::time::Instant;

use chatpipe_schemas::ConversationId;

use super::commits::PendingOffsets;
use super::members::Members;
use super::plan::Coalescer;
use crate::settings::FanoutSettings;

/// What fanout keeps between records: the members it knows, the reads and deliveries
/// it holds back, and the bookkeeping that says which offsets may be committed. Changed
/// only here, by the methods below and the processor's steps; no I/O.
pub struct State {
    pub members: Members,
    pub coalescer: Coalescer,
    /// Partitions whose changelog has been read since they were assigned.
    pub restored: HashSet<i32>,
    /// Partitions were assigned since the presence table last caught up with
    /// chat.presence's end: once per assignment, before its first partition is joined.
    pub presence_due: bool,
    /// Conversations whose changelog entry changed since the last write, and their
    /// partition: written once per tick, whatever the changes (a group of 1,000 made in
    /// one call is one entry, not 1,000 growing ones). Written before any offset
    /// snapshot, so no offset is committed ahead of its entry.
    pub dirty: HashMap<ConversationId, i32>,
    /// Numbers of refused writes that the next write of a conversation stands for.
    pub covers: HashMap<ConversationId, Vec<u64>>,
    /// Number of the next record produced (list or changelog entry).
    pub sent: u64,
    pub offsets: PendingOffsets,
    /// Offsets released during a revoke, handed to the reader with the next
    /// `committable`.
    pub released: HashMap<i32, i64>,
    pub next_tick: Instant,
}

impl State {
    pub fn new(cfg: &FanoutSettings) -> Self {
        Self {
            members: Members::new(cfg.max_cached_conversations, cfg.max_cached_members),
            coalescer: Coalescer::default(),
            restored: HashSet::new(),
            presence_due: true,
            dirty: HashMap::new(),
            covers: HashMap::new(),
            sent: 0,
            offsets: PendingOffsets::default(),
            released: HashMap::new(),
            next_tick: Instant::now(),
        }
    }

    /// The number of the next record produced; its offsets wait for its ack.
    pub fn number(&mut self) -> u64 {
        let n = self.sent;
        self.sent += 1;
        n
    }

    /// Remembers that `conversation`'s changelog entry must be written this tick.
    pub fn mark_dirty(&mut self, partition: i32, conversation: ConversationId) {
        if self.dirty.insert(conversation, partition).is_some() {
            metrics::counter!("fanout_changelog_coalesced_total").increment(1);
        }
    }

    /// Keeps the offsets that everything before `oldest` (the oldest record not yet
    /// acknowledged) releases, for the next commit.
    pub fn release(&mut self, oldest: Option<u64>) {
        for (p, o) in self.offsets.releasable(oldest) {
            let e = self.released.entry(p).or_insert(o);
            *e = (*e).max(o);
        }
    }

    /// Forgets `partitions` (revoked): their members, that they were restored, and
    /// their pending offsets.
    pub fn forget(&mut self, partitions: &[i32]) {
        self.members.drop_partitions(partitions);
        for p in partitions {
            self.restored.remove(p);
        }
        self.offsets.forget(partitions);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> FanoutSettings {
        crate::settings::Settings::load(None)
            .expect("the defaults load")
            .fanout
    }

    #[test]
    fn records_are_numbered_in_order_and_a_conversation_is_dirty_once_per_tick() {
        let mut state = State::new(&settings());
        assert_eq!((state.number(), state.number(), state.number()), (0, 1, 2));
        let c = ConversationId::of(7);
        state.mark_dirty(3, c);
        state.mark_dirty(3, c);
        assert_eq!(state.dirty.len(), 1);
    }

    #[test]
    fn offsets_are_released_up_to_the_oldest_unacknowledged_record_and_revoked_ones_forgotten() {
        let mut state = State::new(&settings());
        state.offsets.read(0, 10);
        state.offsets.read(1, 20);
        let n = state.number(); // a list produced after both reads
        state.offsets.snapshot(state.sent);
        // The list is not acknowledged yet: nothing is released.
        state.release(Some(n));
        assert!(state.released.is_empty());
        // Acknowledged: both partitions' offsets are released (the next to read).
        state.release(None);
        let mut released: Vec<(i32, i64)> = state.released.clone().into_iter().collect();
        released.sort();
        assert_eq!(released, vec![(0, 11), (1, 21)]);
        // A revoked partition's pending offsets go with it.
        state.offsets.read(0, 11);
        state.offsets.snapshot(state.sent);
        state.restored.insert(0);
        state.forget(&[0]);
        assert!(!state.restored.contains(&0));
        state.released.clear();
        state.release(None);
        assert!(state.released.is_empty(), "{:?}", state.released);
    }
}
