//! Offsets: what the processor released, merged per partition, committed after the
//! side effect, forgotten for partitions revoked.

use super::*;

/// Offsets the processor released, and those the broker confirmed.
#[derive(Default)]
pub(super) struct Offsets {
    pub(super) desired: HashMap<i32, i64>,
    pub(super) committed: HashMap<i32, i64>,
}

impl Offsets {
    pub(super) fn merge(&mut self, released: Vec<(i32, i64)>) {
        for (p, o) in released {
            let e = self.desired.entry(p).or_insert(o);
            *e = (*e).max(o);
        }
    }

    /// Desired offsets not yet confirmed, of `partitions` (all if `None`).
    pub(super) fn pending(&self, partitions: Option<&[i32]>) -> Vec<(i32, i64)> {
        self.desired
            .iter()
            .filter(|(p, _)| partitions.is_none_or(|ps| ps.contains(p)))
            .filter(|(p, o)| self.committed.get(p).is_none_or(|c| c < o))
            .map(|(p, o)| (*p, *o))
            .collect()
    }

    pub(super) fn forget(&mut self, partitions: &[i32]) {
        self.desired.retain(|p, _| !partitions.contains(p));
        self.committed.retain(|p, _| !partitions.contains(p));
    }
}

pub(super) fn offset_list(
    topic: &str,
    offsets: &[(i32, i64)],
) -> rdkafka::error::KafkaResult<TopicPartitionList> {
    let mut tpl = TopicPartitionList::new();
    for (p, o) in offsets {
        tpl.add_partition_offset(topic, *p, Offset::Offset(*o))?;
    }
    Ok(tpl)
}

impl<P: Processor> Reader<P> {
    /// A held record of a partition that was revoked is the next owner's now.
    pub(super) fn forget_revoked(&mut self) {
        let revoked = std::mem::take(&mut *self.core.shared.revoked.lock().expect("revoked lock"));
        if revoked.is_empty() {
            return;
        }
        let held_partition = match self.hold.as_ref().map(|h| &h.what) {
            Some(Held::Record(m)) => Some(m.partition()),
            _ => None,
        };
        if held_partition.is_some_and(|p| revoked.contains(&p)) {
            tracing::info!(reader = %self.spec().name, "the held record's partition was revoked: its next owner reads it");
            let hold = self.hold.take().expect("holding");
            self.recovered(&hold);
        }
    }

    pub(super) fn release_offsets(&mut self) {
        let released = self.core.shared.processor().committable();
        if !released.is_empty() {
            self.core.shared.offsets().merge(released);
        }
    }

    /// Commits what the processor released and the broker has not confirmed.
    pub(super) fn commit(&self, mode: CommitMode) {
        if !matches!(self.spec().source, Source::Group { .. }) {
            return;
        }
        let pending = self.core.shared.offsets().pending(None);
        if pending.is_empty() {
            return;
        }
        let result = offset_list(&self.spec().topic, &pending)
            .and_then(|tpl| self.consumer.commit(&tpl, mode));
        match (result, mode) {
            (Ok(()), CommitMode::Sync) => {
                let mut offsets = self.core.shared.offsets();
                for (p, o) in pending {
                    offsets.committed.insert(p, o);
                }
            }
            (Ok(()), CommitMode::Async) => {}
            (Err(err), _) => {
                self.core.shared.metrics.commit_failures.increment(1);
                tracing::warn!(reader = %self.spec().name, "offset commit failed (sent again later): {err}");
            }
        }
    }
}
