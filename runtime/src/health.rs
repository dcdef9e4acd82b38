//! Whether each reader of a process is keeping up, for `/readyz` and the
//! `<reader>_consumer_stalled` gauges. A reader is stalled when it has not polled for
//! `stall_after`, or when records are waiting for it (lag, or a record held through an
//! outage) and it has made no progress for `stall_after`. A reader that is caught up
//! and idle is fine, however long it has been idle.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Serialize;
// Tokio's clock: the real one in reader threads, a paused one in unit tests.
use tokio::time::Instant;

/// The readers of one process.
#[derive(Clone, Default)]
pub struct Readiness {
    readers: Arc<Mutex<Vec<Arc<ReaderHealth>>>>,
}

/// What `/readyz` says of one reader.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ReaderReport {
    pub reader: String,
    pub stalled: bool,
    /// Why it is stalled, in words.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Records between the reader's position and the end of its partitions (as the
    /// client last saw them).
    pub lag: i64,
    pub ms_since_progress: u64,
    /// The partitions the reader holds now.
    pub partitions: Vec<i32>,
}

impl Readiness {
    /// Registers a reader. `metric` names its gauge `<metric>_consumer_stalled`.
    pub fn reader(&self, name: &str, metric: &str, stall_after: Duration) -> Arc<ReaderHealth> {
        let health = Arc::new(ReaderHealth {
            name: name.to_owned(),
            gauge: format!("{metric}_consumer_stalled"),
            stall_after_ms: stall_after.as_millis() as u64,
            epoch: Instant::now(),
            last_poll_ms: AtomicU64::new(0),
            last_progress_ms: AtomicU64::new(0),
            lag: AtomicI64::new(0),
            partitions: Mutex::default(),
            holding: Mutex::new(None),
            unanswered_since: AtomicU64::new(0),
            finished: AtomicBool::new(false),
        });
        self.readers
            .lock()
            .expect("readiness lock")
            .push(health.clone());
        health
    }

    /// Every reader's state now; sets the gauges. Readers that finished are dropped.
    pub fn report(&self) -> Vec<ReaderReport> {
        let mut readers = self.readers.lock().expect("readiness lock");
        readers.retain(|r| !r.finished.load(Ordering::Relaxed));
        readers
            .iter()
            .map(|r| {
                let report = r.report();
                metrics::gauge!(r.gauge.clone()).set(if report.stalled { 1.0 } else { 0.0 });
                report
            })
            .collect()
    }

    /// True when no reader is stalled.
    pub fn ready(&self) -> bool {
        self.report().iter().all(|r| !r.stalled)
    }
}

/// One reader's liveness, written by its loop and its statistics callback.
pub struct ReaderHealth {
    name: String,
    gauge: String,
    stall_after_ms: u64,
    epoch: Instant,
    last_poll_ms: AtomicU64,
    last_progress_ms: AtomicU64,
    lag: AtomicI64,
    partitions: Mutex<BTreeSet<i32>>,
    /// Since when, and why, the reader holds a record it cannot process yet.
    holding: Mutex<Option<(u64, String)>>,
    /// Since when (ms since `epoch`, plus 1) the broker has not answered the reader's
    /// questions about its partitions; 0 while it answers.
    unanswered_since: AtomicU64,
    finished: AtomicBool,
}

impl ReaderHealth {
    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    /// The loop came around (it polls at least every `max_poll`).
    pub fn polled(&self) {
        self.last_poll_ms.store(self.now_ms(), Ordering::Relaxed);
    }

    /// A record was processed, or offsets were committed.
    pub fn progressed(&self) {
        self.last_progress_ms
            .store(self.now_ms(), Ordering::Relaxed);
    }

    /// Records waiting, summed over the reader's partitions.
    pub fn set_lag(&self, lag: i64) {
        self.lag.store(lag, Ordering::Relaxed);
        if lag == 0 {
            // Caught up: nothing is waiting, so idling is not stalling.
            self.progressed();
        }
    }

    /// Partitions given to the reader (by its group, or assigned by itself).
    pub fn assigned(&self, partitions: &[i32]) {
        self.partitions
            .lock()
            .expect("partitions lock")
            .extend(partitions);
    }

    /// Partitions taken from the reader by a rebalance.
    pub fn revoked(&self, partitions: &[i32]) {
        let mut held = self.partitions.lock().expect("partitions lock");
        for p in partitions {
            held.remove(p);
        }
    }

    /// The reader holds a record (or a flush) through an outage.
    pub fn hold(&self, reason: String) {
        let mut holding = self.holding.lock().expect("holding lock");
        let since = holding.as_ref().map_or_else(|| self.now_ms(), |(t, _)| *t);
        *holding = Some((since, reason));
    }

    /// The broker did not answer the reader's question about its partitions (an
    /// outage: the reader waits it out, but past `stall_after_ms` it is stalled).
    pub fn broker_silent(&self) {
        let now = self.now_ms() + 1;
        let _ =
            self.unanswered_since
                .compare_exchange(0, now, Ordering::Relaxed, Ordering::Relaxed);
    }

    /// The broker answered (or a record arrived).
    pub fn broker_answered(&self) {
        self.unanswered_since.store(0, Ordering::Relaxed);
    }

    pub fn release(&self) {
        *self.holding.lock().expect("holding lock") = None;
        self.progressed();
    }

    /// The reader ended (stopped on purpose); it no longer counts.
    pub fn finish(&self) {
        self.finished.store(true, Ordering::Relaxed);
    }

    pub fn report(&self) -> ReaderReport {
        let now = self.now_ms();
        let since_poll = now.saturating_sub(self.last_poll_ms.load(Ordering::Relaxed));
        let since_progress = now.saturating_sub(self.last_progress_ms.load(Ordering::Relaxed));
        let lag = self.lag.load(Ordering::Relaxed);
        let holding = self.holding.lock().expect("holding lock").clone();
        let limit = self.stall_after_ms;
        let silent_for = match self.unanswered_since.load(Ordering::Relaxed) {
            0 => 0,
            since => now.saturating_sub(since - 1),
        };
        let reason = if since_poll > limit {
            Some(format!("has not polled for {since_poll} ms"))
        } else if silent_for > limit {
            Some(format!(
                "the broker has not answered for {silent_for} ms (waiting it out)"
            ))
        } else if let Some((since, why)) = holding.filter(|(t, _)| now.saturating_sub(*t) > limit) {
            Some(format!(
                "has been retrying for {} ms: {why}",
                now.saturating_sub(since)
            ))
        } else if lag > 0 && since_progress > limit {
            Some(format!(
                "{lag} records waiting and no progress for {since_progress} ms"
            ))
        } else {
            None
        };
        ReaderReport {
            reader: self.name.clone(),
            stalled: reason.is_some(),
            reason,
            lag,
            ms_since_progress: since_progress,
            partitions: self
                .partitions
                .lock()
                .expect("partitions lock")
                .iter()
                .copied()
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::time::advance;

    fn reader(stall_after_ms: u64) -> (Readiness, Arc<ReaderHealth>) {
        let readiness = Readiness::default();
        let r = readiness.reader("r", "test", Duration::from_millis(stall_after_ms));
        (readiness, r)
    }

    const PAST_LIMIT: Duration = Duration::from_millis(30);

    #[tokio::test(start_paused = true)]
    async fn an_idle_reader_that_is_caught_up_is_ready() {
        let (readiness, r) = reader(20);
        r.set_lag(0);
        advance(PAST_LIMIT).await;
        r.polled();
        assert!(readiness.ready());
    }

    #[tokio::test(start_paused = true)]
    async fn lag_without_progress_is_a_stall() {
        let (readiness, r) = reader(20);
        r.progressed();
        r.set_lag(5);
        r.polled();
        assert!(readiness.ready(), "within stall_after");
        advance(PAST_LIMIT).await;
        r.polled();
        let report = &readiness.report()[0];
        assert!(report.stalled, "{report:?}");
        assert!(report
            .reason
            .as_deref()
            .unwrap()
            .contains("5 records waiting"));
        r.progressed();
        assert!(readiness.ready(), "progress clears it");
    }

    #[tokio::test(start_paused = true)]
    async fn a_reader_that_stops_polling_is_stalled_even_with_no_lag() {
        let (readiness, r) = reader(20);
        r.polled();
        r.set_lag(0);
        advance(PAST_LIMIT).await;
        let report = &readiness.report()[0];
        assert!(report.reason.as_deref().unwrap().contains("has not polled"));
    }

    #[tokio::test(start_paused = true)]
    async fn holding_a_record_too_long_is_a_stall_and_release_clears_it() {
        let (readiness, r) = reader(20);
        r.hold("registry unavailable".into());
        advance(PAST_LIMIT).await;
        r.polled();
        r.set_lag(0);
        let report = &readiness.report()[0];
        assert!(report
            .reason
            .as_deref()
            .unwrap()
            .contains("registry unavailable"));
        r.release();
        assert!(readiness.ready());
    }

    #[tokio::test(start_paused = true)]
    async fn a_broker_silent_past_the_limit_is_a_stall_though_the_reader_polls() {
        let (readiness, r) = reader(20);
        r.broker_silent();
        advance(Duration::from_millis(15)).await;
        r.polled();
        r.broker_silent(); // still silent: the first silence counts
        assert!(readiness.ready(), "not yet past the limit");
        advance(Duration::from_millis(15)).await;
        r.polled();
        let report = &readiness.report()[0];
        assert!(report.stalled);
        assert!(report
            .reason
            .as_deref()
            .unwrap()
            .contains("the broker has not answered"));
        r.broker_answered();
        assert!(readiness.ready());
    }

    #[tokio::test(start_paused = true)]
    async fn finished_readers_no_longer_count() {
        let (readiness, r) = reader(20);
        advance(PAST_LIMIT).await;
        assert!(!readiness.ready());
        r.finish();
        assert!(readiness.ready());
    }
}
