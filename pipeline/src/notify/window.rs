//! The collapse windows, free of I/O: the new messages of each conversation wait
//! `collapse_ms` from the first one, then go out together (one notification per member
//! for all of them), and the offsets a reader may commit are those below every message
//! still waiting.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use chatpipe_schemas::ConversationId;

/// The new messages of one conversation waiting to go out.
#[derive(Debug, Clone, PartialEq)]
pub struct Window {
    pub opened: Instant,
    pub seqs: Vec<i64>,
    partition: i32,
    first_offset: i64,
}

#[derive(Debug, Default)]
pub struct Windows {
    open: HashMap<ConversationId, Window>,
    /// Per partition: the offset after the last record read.
    next: BTreeMap<i32, i64>,
}

impl Windows {
    /// A record read at (`partition`, `offset`): a new message of `conversation` (seq),
    /// or anything else (`None`).
    pub fn add(
        &mut self,
        (partition, offset): (i32, i64),
        message: Option<(ConversationId, i64)>,
        now: Instant,
    ) {
        let next = self.next.entry(partition).or_insert(offset + 1);
        *next = (*next).max(offset + 1);
        if let Some((conversation, seq)) = message {
            self.open
                .entry(conversation)
                .or_insert_with(|| Window {
                    opened: now,
                    seqs: Vec::new(),
                    partition,
                    first_offset: offset,
                })
                .seqs
                .push(seq);
        }
    }

    /// The windows open `collapse` or longer, oldest first; and, past `max_open`, the
    /// oldest of the others until `max_open` are left (they go out early).
    pub fn due(&self, now: Instant, collapse: Duration, max_open: usize) -> Vec<ConversationId> {
        let mut by_age: Vec<(&ConversationId, &Window)> = self.open.iter().collect();
        by_age.sort_by_key(|(c, w)| (w.opened, **c));
        let over = self.open.len().saturating_sub(max_open);
        by_age
            .into_iter()
            .enumerate()
            .filter(|(i, (_, w))| *i < over || now.duration_since(w.opened) >= collapse)
            .map(|(_, (c, _))| *c)
            .collect()
    }

    pub fn get(&self, conversation: ConversationId) -> Option<&Window> {
        self.open.get(&conversation)
    }

    /// The window of `conversation` went out (its notifications acknowledged).
    pub fn close(&mut self, conversation: ConversationId) {
        self.open.remove(&conversation);
    }

    pub fn open_count(&self) -> usize {
        self.open.len()
    }

    /// Per partition read: the offset to commit, below every message still waiting.
    pub fn committable(&self) -> Vec<(i32, i64)> {
        self.next
            .iter()
            .map(|(&partition, &next)| {
                let waiting = self
                    .open
                    .values()
                    .filter(|w| w.partition == partition)
                    .map(|w| w.first_offset)
                    .min();
                (partition, waiting.unwrap_or(next))
            })
            .collect()
    }

    /// Partitions taken away: their windows are forgotten (the next owner reads them
    /// again from the last commit, which is below each of them).
    pub fn forget(&mut self, partitions: &[i32]) {
        self.open.retain(|_, w| !partitions.contains(&w.partition));
        self.next.retain(|p, _| !partitions.contains(p));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conv(id: i64) -> ConversationId {
        ConversationId::of(id)
    }

    #[test]
    fn a_window_collects_its_conversations_messages_until_collapse_ms_from_the_first() {
        let t0 = Instant::now();
        let mut w = Windows::default();
        w.add((0, 10), Some((conv(1), 5)), t0);
        w.add((0, 11), Some((conv(1), 6)), t0 + Duration::from_millis(900));
        w.add((0, 12), None, t0 + Duration::from_millis(950));
        let collapse = Duration::from_secs(1);
        assert!(w
            .due(t0 + Duration::from_millis(999), collapse, 10)
            .is_empty());
        assert_eq!(w.due(t0 + collapse, collapse, 10), vec![conv(1)]);
        assert_eq!(w.get(conv(1)).unwrap().seqs, vec![5, 6]);
    }

    #[test]
    fn offsets_stop_below_the_first_waiting_message_of_each_partition() {
        let t0 = Instant::now();
        let mut w = Windows::default();
        w.add((0, 10), None, t0);
        w.add((0, 11), Some((conv(1), 1)), t0);
        w.add((0, 12), Some((conv(3), 1)), t0);
        w.add((1, 40), None, t0);
        assert_eq!(w.committable(), vec![(0, 11), (1, 41)]);
        w.close(conv(1));
        assert_eq!(w.committable(), vec![(0, 12), (1, 41)]);
        w.close(conv(3));
        assert_eq!(w.committable(), vec![(0, 13), (1, 41)]);
    }

    #[test]
    fn past_max_open_the_oldest_windows_go_out_early() {
        let t0 = Instant::now();
        let mut w = Windows::default();
        for (i, c) in [7, 3, 9].into_iter().enumerate() {
            w.add(
                (0, i as i64),
                Some((conv(c), 1)),
                t0 + Duration::from_millis(i as u64),
            );
        }
        let long = Duration::from_secs(60);
        assert_eq!(w.due(t0, long, 1), vec![conv(7), conv(3)]);
        assert!(w.due(t0, long, 3).is_empty());
    }

    #[test]
    fn revoked_partitions_forget_their_windows() {
        let t0 = Instant::now();
        let mut w = Windows::default();
        w.add((0, 1), Some((conv(1), 1)), t0);
        w.add((1, 1), Some((conv(2), 1)), t0);
        w.forget(&[0]);
        assert_eq!(w.open_count(), 1);
        assert_eq!(w.committable(), vec![(1, 1)]);
    }
}
