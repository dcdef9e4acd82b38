//! The receipts aggregator's state: per partition, the highest seq per (conversation,
//! user) since the last flush, and the offset to commit once that flush is durable.
//!
//! A window opens with its first receipt and is due `debounce_window` later, or as soon
//! as it holds `max_batch_keys` distinct keys, or (with [`Window::with_quiet`]) once no
//! receipt came for `quiet_flush`: a lone read is applied at once, a storm with no such
//! pause is still batched. Time comes in as a parameter so the debounce is tested with
//! paused time.

use std::collections::HashMap;
use std::time::Duration;

use chatpipe_schemas::{ConversationId, Seq, UserId};
use tokio::time::Instant;

/// A member of a conversation.
pub type MemberKey = (ConversationId, UserId);

#[derive(Debug, Default)]
struct PartitionWindow {
    max_seq: HashMap<MemberKey, Seq>,
    /// The offset after the last record taken in: what to commit after the flush.
    next_offset: Option<i64>,
}

#[derive(Debug)]
pub struct Window {
    debounce: Duration,
    max_batch_keys: usize,
    partitions: HashMap<i32, PartitionWindow>,
    keys: usize,
    receipts: u64,
    opened_at: Option<Instant>,
    /// `None`: due by the debounce and the batch size only.
    quiet: Option<Duration>,
    /// The last record taken in, while the window is open.
    last_at: Option<Instant>,
}

/// Why a window is due (`receipts_windows_total{reason}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Due {
    /// It holds `max_batch_keys` distinct keys.
    Full,
    /// `debounce_window` since its first record.
    Debounce,
    /// `quiet_flush` since its last record.
    Quiet,
}

impl Due {
    pub fn label(self) -> &'static str {
        match self {
            Self::Full => "full",
            Self::Debounce => "debounce",
            Self::Quiet => "quiet",
        }
    }
}

/// What one flush writes and then commits.
#[derive(Debug, Default, PartialEq)]
pub struct Batch {
    /// Sorted by key, so concurrent flushes lock member rows in one order.
    pub watermarks: Vec<(MemberKey, Seq)>,
    /// partition -> offset to commit after the database commit.
    pub offsets: Vec<(i32, i64)>,
    /// Receipts that collapsed into `watermarks`.
    pub receipts: u64,
}

impl Batch {
    pub fn is_empty(&self) -> bool {
        self.watermarks.is_empty() && self.offsets.is_empty()
    }

    /// Folds `other` in: the higher seq per key, the higher offset per partition.
    pub fn merge(&mut self, other: Batch) {
        let mut watermarks: HashMap<MemberKey, Seq> = self.watermarks.drain(..).collect();
        for (key, seq) in other.watermarks {
            let e = watermarks.entry(key).or_insert(seq);
            *e = (*e).max(seq);
        }
        let mut offsets: HashMap<i32, i64> = self.offsets.drain(..).collect();
        for (p, o) in other.offsets {
            let e = offsets.entry(p).or_insert(o);
            *e = (*e).max(o);
        }
        self.watermarks = watermarks.into_iter().collect();
        self.watermarks.sort_unstable();
        self.offsets = offsets.into_iter().collect();
        self.offsets.sort_unstable();
        self.receipts += other.receipts;
    }
}

impl Window {
    pub fn new(debounce: Duration, max_batch_keys: usize) -> Self {
        Self {
            debounce,
            max_batch_keys,
            partitions: HashMap::new(),
            keys: 0,
            receipts: 0,
            opened_at: None,
            quiet: None,
            last_at: None,
        }
    }

    /// The window is also due once no record came for `quiet` (not at all if zero).
    pub fn with_quiet(mut self, quiet: Duration) -> Self {
        self.quiet = (!quiet.is_zero()).then_some(quiet);
        self
    }

    /// Takes in one receipt read at `offset` of `partition`.
    pub fn add(&mut self, partition: i32, offset: i64, key: MemberKey, seq: Seq, now: Instant) {
        let p = self.partitions.entry(partition).or_default();
        match p.max_seq.get_mut(&key) {
            Some(max) => *max = (*max).max(seq),
            None => {
                p.max_seq.insert(key, seq);
                self.keys += 1;
            }
        }
        p.next_offset = Some(offset + 1);
        self.receipts += 1;
        self.opened_at.get_or_insert(now);
        self.last_at = Some(now);
    }

    /// A record that carries no receipt (e.g. sent to the dead-letter topic): its offset
    /// is committed with the next flush.
    pub fn skip(&mut self, partition: i32, offset: i64, now: Instant) {
        self.partitions.entry(partition).or_default().next_offset = Some(offset + 1);
        self.opened_at.get_or_insert(now);
        self.last_at = Some(now);
    }

    /// Whether the open window is due now, and why.
    pub fn due(&self, now: Instant) -> Option<Due> {
        let opened = self.opened_at?;
        if self.keys >= self.max_batch_keys {
            Some(Due::Full)
        } else if now >= opened + self.debounce {
            Some(Due::Debounce)
        } else if self
            .quiet
            .zip(self.last_at)
            .is_some_and(|(q, t)| now >= t + q)
        {
            Some(Due::Quiet)
        } else {
            None
        }
    }

    /// A window is open: it holds a record not taken yet.
    pub fn is_open(&self) -> bool {
        self.opened_at.is_some()
    }

    pub fn distinct_keys(&self) -> usize {
        self.keys
    }

    /// Everything, for a flush; the window closes.
    pub fn take_all(&mut self) -> Batch {
        let all: Vec<i32> = self.partitions.keys().copied().collect();
        self.take(&all)
    }

    /// Only these partitions (revoked in a rebalance); the rest stays.
    pub fn take(&mut self, partitions: &[i32]) -> Batch {
        let mut batch = Batch::default();
        for partition in partitions {
            let Some(p) = self.partitions.remove(partition) else {
                continue;
            };
            self.keys -= p.max_seq.len();
            batch.watermarks.extend(p.max_seq);
            if let Some(offset) = p.next_offset {
                batch.offsets.push((*partition, offset));
            }
        }
        batch.watermarks.sort_unstable();
        batch.offsets.sort_unstable();
        if self.partitions.is_empty() {
            batch.receipts = std::mem::take(&mut self.receipts);
            self.opened_at = None;
            self.last_at = None;
        } else {
            // Attribute the count to this batch; the rest of the window keeps its start.
            batch.receipts = self.receipts;
            self.receipts = 0;
        }
        batch
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Adds a receipt given as plain numbers.
    fn add(
        w: &mut Window,
        partition: i32,
        offset: i64,
        (c, u): (i64, i64),
        seq: i64,
        now: Instant,
    ) {
        let key = (ConversationId::of(c), UserId::of(u));
        w.add(partition, offset, key, Seq::of(seq), now);
    }

    /// Watermarks given as plain numbers.
    fn typed(marks: &[((i64, i64), i64)]) -> Vec<(MemberKey, Seq)> {
        let key = |c, u| (ConversationId::of(c), UserId::of(u));
        marks
            .iter()
            .map(|&((c, u), s)| (key(c, u), Seq::of(s)))
            .collect()
    }

    /// A batch's watermarks as plain numbers.
    fn marks(batch: &Batch) -> Vec<((i64, i64), i64)> {
        let raw = |((c, u), s): &(MemberKey, Seq)| ((c.get(), u.get()), s.get());
        batch.watermarks.iter().map(raw).collect()
    }

    #[tokio::test(start_paused = true)]
    async fn a_window_is_due_one_debounce_after_its_first_receipt() {
        let mut w = Window::new(Duration::from_secs(1), 1000);
        assert!(
            w.due(Instant::now()).is_none(),
            "an empty window is never due"
        );
        add(&mut w, 0, 10, (7, 20), 5, Instant::now());
        tokio::time::advance(Duration::from_millis(600)).await;
        add(&mut w, 0, 11, (7, 20), 9, Instant::now()); // later receipts do not extend the window
        tokio::time::advance(Duration::from_millis(399)).await;
        assert!(w.due(Instant::now()).is_none());
        tokio::time::advance(Duration::from_millis(1)).await;
        assert_eq!(w.due(Instant::now()), Some(Due::Debounce));

        let batch = w.take_all();
        assert_eq!(marks(&batch), vec![((7, 20), 9)]);
        assert_eq!(batch.offsets, vec![(0, 12)]);
        assert_eq!(batch.receipts, 2);
        assert!(w.due(Instant::now()).is_none(), "taking closes the window");
        assert!(!w.is_open());
    }

    #[tokio::test(start_paused = true)]
    async fn a_window_is_due_a_quiet_period_after_its_last_receipt_or_at_the_debounce() {
        let quiet = Duration::from_millis(100);
        let mut w = Window::new(Duration::from_secs(1), 1000).with_quiet(quiet);
        // A lone receipt: due once nothing followed it for 100 ms.
        add(&mut w, 0, 0, (7, 20), 5, Instant::now());
        tokio::time::advance(Duration::from_millis(99)).await;
        assert!(w.due(Instant::now()).is_none());
        tokio::time::advance(Duration::from_millis(1)).await;
        assert_eq!(
            w.due(Instant::now()),
            Some(Due::Quiet),
            "100 ms without a receipt"
        );
        assert_eq!(marks(&w.take_all()), vec![((7, 20), 5)]);

        // A storm: a receipt every 50 ms never leaves 100 ms quiet, so the window runs
        // to its debounce and takes all of them in one batch.
        let opened = Instant::now();
        for i in 0..25 {
            add(&mut w, 0, 1 + i, (7, 20 + i), 6, Instant::now());
            if w.due(Instant::now()).is_some() {
                break;
            }
            tokio::time::advance(Duration::from_millis(50)).await;
        }
        assert_eq!(Instant::now() - opened, Duration::from_secs(1));
        assert_eq!(
            w.due(Instant::now()),
            Some(Due::Debounce),
            "the debounce ends the storm's window"
        );
        assert_eq!(w.take_all().watermarks.len(), 21);
        assert!(!w.is_open(), "taking closes the window");
    }

    #[tokio::test(start_paused = true)]
    async fn the_highest_seq_per_member_wins_whatever_the_order() {
        let mut w = Window::new(Duration::from_secs(1), 1000);
        let now = Instant::now();
        for (i, seq) in [50, 45, 3, 50, 49].into_iter().enumerate() {
            add(&mut w, 1, i as i64, (7, 20), seq, now);
        }
        add(&mut w, 1, 5, (7, 30), 2, now);
        add(&mut w, 2, 0, (8, 20), 4, now);
        let batch = w.take_all();
        assert_eq!(
            marks(&batch),
            vec![((7, 20), 50), ((7, 30), 2), ((8, 20), 4)]
        );
        assert_eq!(batch.offsets, vec![(1, 6), (2, 1)]);
        assert_eq!(batch.receipts, 7);
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_batch_is_due_before_the_window_closes() {
        let mut w = Window::new(Duration::from_secs(1), 3);
        let now = Instant::now();
        add(&mut w, 0, 0, (1, 1), 1, now);
        add(&mut w, 0, 1, (1, 1), 2, now);
        add(&mut w, 0, 2, (1, 2), 1, now);
        assert!(w.due(now).is_none(), "two distinct keys");
        add(&mut w, 0, 3, (1, 3), 1, now);
        assert_eq!(
            w.due(now),
            Some(Due::Full),
            "three distinct keys fill the batch"
        );
    }

    #[test]
    fn merged_batches_keep_the_highest_seq_and_offset() {
        let mut a = Batch {
            watermarks: typed(&[((1, 1), 5), ((1, 2), 9)]),
            offsets: vec![(0, 10)],
            receipts: 3,
        };
        a.merge(Batch {
            watermarks: typed(&[((1, 1), 7), ((2, 1), 1)]),
            offsets: vec![(0, 8), (1, 4)],
            receipts: 2,
        });
        assert_eq!(marks(&a), vec![((1, 1), 7), ((1, 2), 9), ((2, 1), 1)]);
        assert_eq!(a.offsets, vec![(0, 10), (1, 4)]);
        assert_eq!(a.receipts, 5);
    }

    #[tokio::test(start_paused = true)]
    async fn revoked_partitions_are_taken_alone() {
        let mut w = Window::new(Duration::from_secs(1), 100);
        let now = Instant::now();
        add(&mut w, 0, 0, (1, 1), 5, now);
        add(&mut w, 1, 0, (2, 1), 6, now);
        w.skip(1, 1, now);
        let revoked = w.take(&[1]);
        assert_eq!(marks(&revoked), vec![((2, 1), 6)]);
        assert_eq!(
            revoked.offsets,
            vec![(1, 2)],
            "the skipped record's offset is committed too"
        );
        assert_eq!(w.distinct_keys(), 1);
        assert!(w.is_open(), "partition 0's window stays open");
        assert_eq!(marks(&w.take_all()), vec![((1, 1), 5)]);
    }
}
