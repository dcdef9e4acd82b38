//! What the archiver holds between two writes: the changes read since the last one, the
//! offsets they make safe to commit, and how far each conversation's messages reach.
//! Time comes in as a parameter, so the linger is tested without a clock.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use chatpipe_core::cold::Change;

#[derive(Debug, Default)]
pub struct Batch {
    pub changes: Vec<Change>,
    /// partition -> the offset to commit once the changes are written.
    pub offsets: HashMap<i32, i64>,
    /// conversation -> its highest `message.new` seq in the batch, and the earliest
    /// `createdAt` (µs) among them: when the first of them may leave PostgreSQL.
    pub archived: HashMap<i64, (i64, i64)>,
    opened_at: Option<Instant>,
}

impl Batch {
    /// Takes in the record at `partition`/`offset` and the change it makes, if any.
    pub fn add(&mut self, partition: i32, offset: i64, change: Option<Change>, now: Instant) {
        self.opened_at.get_or_insert(now);
        let next = self.offsets.entry(partition).or_insert(offset + 1);
        *next = (*next).max(offset + 1);
        if let Some(change) = change {
            if let Change::New {
                conversation,
                seq,
                created_at,
                ..
            } = change
            {
                let (top, first) = self
                    .archived
                    .entry(conversation)
                    .or_insert((seq, created_at));
                *top = (*top).max(seq);
                *first = (*first).min(created_at);
            }
            self.changes.push(change);
        }
    }

    /// Time to write: `max_changes` are waiting, or the first record came `linger` ago.
    pub fn due(&self, now: Instant, linger: Duration, max_changes: usize) -> bool {
        self.changes.len() >= max_changes
            || self
                .opened_at
                .is_some_and(|opened| now.duration_since(opened) >= linger)
    }

    pub fn is_empty(&self) -> bool {
        self.offsets.is_empty()
    }

    /// The partitions went to another reader: their offsets are no longer ours to
    /// commit. Their changes stay: writing them again later is harmless.
    pub fn forget_offsets(&mut self, partitions: &[i32]) {
        self.offsets.retain(|p, _| !partitions.contains(p));
    }

    /// The offsets to commit, once the batch is written; the batch starts over.
    pub fn done(&mut self) -> Vec<(i32, i64)> {
        let offsets = self.offsets.drain().collect();
        *self = Self::default();
        offsets
    }
}

/// The Cassandra requests that write `changes`: those of one partition (`key`) together,
/// at most `max_rows` a request, in the order they came.
pub fn requests<K: std::hash::Hash + Eq>(
    changes: &[Change],
    key: impl Fn(&Change) -> K,
    max_rows: usize,
) -> Vec<Vec<&Change>> {
    let max_rows = max_rows.max(1);
    let mut open: HashMap<K, usize> = HashMap::new();
    let mut requests: Vec<Vec<&Change>> = Vec::new();
    for change in changes {
        let key = key(change);
        match open.get(&key) {
            Some(&at) if requests[at].len() < max_rows => requests[at].push(change),
            _ => {
                open.insert(key, requests.len());
                requests.push(vec![change]);
            }
        }
    }
    requests
}

#[cfg(test)]
mod tests {
    use super::*;

    fn new(conversation: i64, seq: i64) -> Change {
        Change::New {
            conversation,
            seq,
            sender: 1,
            client_msg_id: uuid::Uuid::nil(),
            body: "b".into(),
            created_at: seq,
            thread_root: None,
        }
    }

    #[test]
    fn offsets_are_the_next_to_read_and_every_record_counts() {
        let now = Instant::now();
        let mut batch = Batch::default();
        batch.add(0, 10, Some(new(7, 1)), now);
        batch.add(0, 11, None, now); // a member.joined: nothing to write, offset done
        batch.add(3, 4, Some(new(8, 5)), now);
        batch.add(0, 12, Some(new(7, 2)), now);
        assert_eq!(batch.changes.len(), 3);
        // created_at is the seq in these changes.
        assert_eq!(batch.archived, HashMap::from([(7, (2, 1)), (8, (5, 5))]));
        let mut offsets = batch.done();
        offsets.sort();
        assert_eq!(offsets, vec![(0, 13), (3, 5)]);
        assert!(batch.is_empty() && batch.changes.is_empty() && batch.archived.is_empty());
    }

    #[test]
    fn due_by_size_or_by_linger_from_the_first_record() {
        let start = Instant::now();
        let linger = Duration::from_millis(50);
        let mut batch = Batch::default();
        assert!(!batch.due(start + linger * 10, linger, 2), "empty");
        batch.add(0, 1, Some(new(1, 1)), start);
        assert!(!batch.due(start + Duration::from_millis(49), linger, 2));
        assert!(batch.due(start + linger, linger, 2));
        batch.add(0, 2, Some(new(1, 2)), start + Duration::from_millis(1));
        assert!(batch.due(start, linger, 2), "full");
    }

    #[test]
    fn revoked_partitions_keep_their_changes_but_not_their_offsets() {
        let now = Instant::now();
        let mut batch = Batch::default();
        batch.add(0, 1, Some(new(1, 1)), now);
        batch.add(1, 1, Some(new(2, 1)), now);
        batch.forget_offsets(&[1]);
        assert_eq!(batch.changes.len(), 2);
        assert_eq!(batch.done(), vec![(0, 2)]);
    }

    #[test]
    fn a_request_holds_one_partitions_changes_up_to_its_bound() {
        let changes: Vec<Change> = [(1, 1), (2, 1), (1, 2), (1, 3), (3, 1), (1, 4)]
            .into_iter()
            .map(|(c, s)| new(c, s))
            .collect();
        let seqs = |max_rows| {
            requests(&changes, Change::conversation, max_rows)
                .iter()
                .map(|r| {
                    r.iter()
                        .map(|c| (c.conversation(), c.seq()))
                        .collect::<Vec<_>>()
                })
                .collect::<Vec<_>>()
        };
        assert_eq!(
            seqs(100),
            vec![
                vec![(1, 1), (1, 2), (1, 3), (1, 4)],
                vec![(2, 1)],
                vec![(3, 1)],
            ]
        );
        assert_eq!(
            seqs(2),
            vec![
                vec![(1, 1), (1, 2)],
                vec![(2, 1)],
                vec![(1, 3), (1, 4)],
                vec![(3, 1)],
            ]
        );
        assert_eq!(
            seqs(0).len(),
            changes.len(),
            "a bound of 0 is one row a request"
        );
    }
}
