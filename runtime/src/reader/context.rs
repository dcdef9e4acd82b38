//! What the consumer's callbacks see: the processor and the offsets shared with the
//! reader, its metrics, and the client context (statistics, rebalances, commits).

use super::*;

/// The reader's metrics, registered once: a record must not pay for a name lookup.
pub(super) struct ReaderMetrics {
    pub(super) records: metrics::Counter,
    pub(super) dlq: metrics::Counter,
    pub(super) retries: metrics::Counter,
    pub(super) consumer_errors: metrics::Counter,
    pub(super) commit_failures: metrics::Counter,
    pub(super) retrying: metrics::Gauge,
    pub(super) refetches: metrics::Counter,
    pub(super) leader_queries: metrics::Counter,
}

impl ReaderMetrics {
    pub(super) fn new(prefix: &str) -> Self {
        assert!(
            chatpipe_core::catalogue::READER_PREFIXES.contains(&prefix),
            "reader metric prefix {prefix} is not in chatpipe_core::catalogue::READER_PREFIXES"
        );
        for (name, kind, help) in chatpipe_core::catalogue::reader_metrics(prefix) {
            chatpipe_core::catalogue::describe(name, kind, help);
        }
        Self {
            records: metrics::counter!(format!("{prefix}_records_total")),
            dlq: metrics::counter!(format!("{prefix}_dlq_total")),
            retries: metrics::counter!(format!("{prefix}_retries_total")),
            consumer_errors: metrics::counter!(format!("{prefix}_consumer_errors_total")),
            commit_failures: metrics::counter!(format!("{prefix}_commit_failures_total")),
            retrying: metrics::gauge!(format!("{prefix}_retrying")),
            refetches: metrics::counter!(format!("{prefix}_refetches_total")),
            leader_queries: metrics::counter!(format!("{prefix}_leader_queries_total")),
        }
    }
}

/// What the consumer's callbacks share with the loop. Callbacks run inside `poll`, on
/// the loop's own thread, so the locks are never contended.
pub(super) struct Shared<P> {
    pub(super) processor: Mutex<P>,
    pub(super) offsets: Mutex<Offsets>,
    pub(super) spec: ReaderSpec,
    pub(super) metrics: ReaderMetrics,
    pub(super) health: Arc<ReaderHealth>,
    /// The loop holds a record: newly assigned partitions are paused at once.
    pub(super) paused: AtomicBool,
    /// Partitions revoked since the loop last looked.
    pub(super) revoked: Mutex<Vec<i32>>,
    /// Assigned partitions the client knows no leader for, from its last statistics.
    pub(super) leaderless: Mutex<Vec<i32>>,
}

impl<P> Shared<P> {
    pub(super) fn processor(&self) -> MutexGuard<'_, P> {
        self.processor.lock().expect("processor lock")
    }

    pub(super) fn offsets(&self) -> MutexGuard<'_, Offsets> {
        self.offsets.lock().expect("offsets lock")
    }
}

/// Records of a partition the reader has yet to process: from its position (what it
/// handed to the processor, else what it committed, else where it fetches next) to the
/// end (the last stable offset). Records below the log's start are gone (retention):
/// they are not waiting, though a committed offset from before their deletion still
/// points at them (seen on chat.ephemeral, whose records live one minute: the typing
/// reader counted 16 deleted signals as waiting and called itself stalled for good).
pub(super) fn waiting(p: &rdkafka::statistics::Partition) -> Option<i64> {
    if p.ls_offset < 0 {
        return None;
    }
    let position = [p.app_offset, p.committed_offset, p.next_offset]
        .into_iter()
        .find(|o| *o >= 0)?;
    let position = if p.lo_offset >= 0 {
        position.max(p.lo_offset)
    } else {
        position
    };
    Some((p.ls_offset - position).max(0))
}

pub struct ReaderContext<P> {
    pub(super) shared: Arc<Shared<P>>,
    pub(super) rebootstrap: chatpipe_core::kafka::Rebootstrap,
}

impl<P: Processor> ClientContext for ReaderContext<P> {
    /// Lag per partition from librdkafka's statistics: the end of the partition (last
    /// stable offset) minus the reader's position. No broker round trip. And a consumer
    /// left without a broker gets its bootstrap servers again (see
    /// [`chatpipe_core::kafka::rebootstrap`]).
    fn stats(&self, statistics: rdkafka::Statistics) {
        self.rebootstrap.observe(&statistics);
        let spec = &self.shared.spec;
        let Some(topic) = statistics.topics.get(&spec.topic) else {
            return;
        };
        let mut total = 0;
        let mut leaderless = Vec::new();
        for (partition, p) in &topic.partitions {
            if *partition < 0 || !p.desired {
                continue;
            }
            if p.leader < 0 || p.unknown {
                leaderless.push(*partition);
            }
            let Some(lag) = waiting(p) else { continue };
            metrics::gauge!(format!("{}_consumer_lag", spec.metric), "partition" => partition.to_string())
                .set(lag as f64);
            total += lag;
        }
        *self.shared.leaderless.lock().expect("leaderless lock") = leaderless;
        self.shared.health.set_lag(total);
    }
}

impl<P: Processor> ConsumerContext for ReaderContext<P> {
    fn pre_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        let Rebalance::Revoke(revoked) = rebalance else {
            return;
        };
        let partitions: Vec<i32> = revoked.elements().iter().map(|e| e.partition()).collect();
        // Lost, not handed over: the group fenced this member (its session expired, as
        // in a broker stall longer than it) and may have given the partitions to
        // another. Nothing can be committed for them any more, and a synchronous commit
        // would wait for a coordinator that refuses this member, inside the callback
        // that must return before the member can rejoin: seen as a fanout reader that
        // did not poll for over 30 s after a 90 s stall. The records are read again
        // from the last commit (at-least-once; consumers dedupe).
        let lost = consumer.assignment_lost();
        tracing::info!(reader = %self.shared.spec.name, ?partitions, lost, "partitions revoked: finishing them first");
        self.shared.health.revoked(&partitions);
        let released = {
            let mut processor = self.shared.processor();
            processor.revoke(&partitions);
            processor.committable()
        };
        let pending = {
            let mut offsets = self.shared.offsets();
            offsets.merge(released);
            let pending = offsets.pending(Some(&partitions));
            offsets.forget(&partitions);
            pending
        };
        if lost && !pending.is_empty() {
            tracing::info!(reader = %self.shared.spec.name, ?partitions, "partitions lost: their offsets are not committed; the next owner reads from the last commit");
        } else if !pending.is_empty() {
            match offset_list(&self.shared.spec.topic, &pending)
                .and_then(|tpl| consumer.commit(&tpl, CommitMode::Sync))
            {
                Ok(()) => self.shared.health.progressed(),
                // Not committed: the next owner reads these records again (harmless).
                Err(err) => {
                    tracing::warn!(reader = %self.shared.spec.name, "committing revoked partitions: {err}")
                }
            }
        }
        self.shared
            .revoked
            .lock()
            .expect("revoked lock")
            .extend(partitions);
    }

    fn post_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Assign(assigned) = rebalance {
            let partitions: Vec<i32> = assigned.elements().iter().map(|e| e.partition()).collect();
            tracing::info!(reader = %self.shared.spec.name, ?partitions, "partitions assigned");
            self.shared.health.assigned(&partitions);
            self.shared.processor().assigned(&partitions);
            if self.shared.paused.load(Ordering::Relaxed) {
                if let Err(err) = consumer.pause(assigned) {
                    tracing::warn!("pausing newly assigned partitions: {err}");
                }
            }
        }
    }

    fn commit_callback(
        &self,
        result: rdkafka::error::KafkaResult<()>,
        offsets: &TopicPartitionList,
    ) {
        match result {
            Ok(()) => {
                let mut book = self.shared.offsets();
                for e in offsets.elements() {
                    if let Offset::Offset(o) = e.offset() {
                        // Only partitions still ours (a revoke forgets them).
                        if book.desired.contains_key(&e.partition()) {
                            let c = book.committed.entry(e.partition()).or_insert(o);
                            *c = (*c).max(o);
                        }
                    }
                }
                self.shared.health.progressed();
            }
            Err(err) => {
                self.shared.metrics.commit_failures.increment(1);
                tracing::warn!(reader = %self.shared.spec.name, "offset commit failed (sent again later): {err}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_waiting_count_from_the_position_and_never_below_the_log_start() {
        const UNSET: i64 = -1001;
        // Processed up to 10 of 15.
        assert_eq!(waiting(&partition(0, 15, 10, 8, 15)), Some(5));
        // Nothing processed since the start: from the committed offset.
        assert_eq!(waiting(&partition(0, 15, UNSET, 12, 12)), Some(3));
        // Committed before retention deleted the records up to 16: none waits.
        assert_eq!(waiting(&partition(16, 16, UNSET, 0, 16)), Some(0));
        assert_eq!(waiting(&partition(16, 17, UNSET, 0, 16)), Some(1));
        // No end known yet.
        assert_eq!(waiting(&partition(UNSET, UNSET, UNSET, 0, 0)), None);
    }

    fn partition(
        lo: i64,
        ls: i64,
        app: i64,
        committed: i64,
        next: i64,
    ) -> rdkafka::statistics::Partition {
        rdkafka::statistics::Partition {
            lo_offset: lo,
            ls_offset: ls,
            app_offset: app,
            committed_offset: committed,
            next_offset: next,
            ..Default::default()
        }
    }
}
