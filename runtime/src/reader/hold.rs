//! Holding a record (or the processor's tick) that failed with a retriable error: the
//! partitions paused, the same record retried after a backoff, for as long as it takes.

use super::*;

/// What the loop holds through an outage.
pub(super) enum Held {
    /// A record not yet applied (or, if poison, not yet in the dead-letter topic).
    Record(OwnedMessage),
    /// The processor's periodic work.
    Tick,
}

pub(super) struct Hold {
    pub(super) what: Held,
    pub(super) since: Instant,
    pub(super) attempts: u32,
    pub(super) retry_at: Instant,
}

impl<P: Processor> Reader<P> {
    /// Holds `what` after a failure: pause the partitions and retry after a backoff.
    pub(super) fn hold_on(&mut self, what: Held, failure: Failure) {
        let now = Instant::now();
        let wait = self.backoff.next_wait();
        tracing::warn!(reader = %self.spec().name, retry_in_ms = wait.as_millis() as u64, "holding its position and retrying: {failure}");
        self.hold = Some(Hold {
            what,
            since: now,
            attempts: 1,
            retry_at: now + wait,
        });
        self.core.shared.paused.store(true, Ordering::Relaxed);
        if let Err(err) = self
            .consumer
            .assignment()
            .and_then(|a| self.consumer.pause(&a))
        {
            tracing::warn!("pausing partitions: {err}");
        }
        self.core.shared.metrics.retrying.set(1.0);
        self.core.shared.metrics.retries.increment(1);
        self.core.shared.health.hold(failure.to_string());
    }

    /// While holding: wait (polling, partitions paused) until the next attempt is due,
    /// then try the held step again.
    pub(super) fn retry_held(&mut self) {
        let retry_at = self.hold.as_ref().expect("holding").retry_at;
        let now = Instant::now();
        if now < retry_at {
            let wait = (retry_at - now).min(self.spec().max_poll.max(Duration::from_millis(100)));
            match self.consumer.poll(wait) {
                // Read before the pause took effect: it is read again after the resume.
                Some(Ok(m)) => {
                    let (p, o) = (m.partition(), m.offset());
                    if let Err(err) = self.consumer.seek(
                        &self.spec().topic,
                        p,
                        Offset::Offset(o),
                        Duration::from_secs(5),
                    ) {
                        tracing::warn!("seeking back to {p}/{o} while paused: {err}");
                    }
                }
                Some(Err(err)) => {
                    self.core.shared.metrics.consumer_errors.increment(1);
                    tracing::debug!("consumer while holding: {err}");
                }
                None => {}
            }
            self.forget_revoked();
            return;
        }
        let mut hold = self.hold.take().expect("holding");
        let result = match &hold.what {
            Held::Record(m) => self.core.take(m),
            Held::Tick => self.core.shared.processor().tick(),
        };
        match result {
            Ok(()) => self.recovered(&hold),
            Err(failure) => {
                let wait = self.backoff.next_wait();
                hold.attempts += 1;
                hold.retry_at = Instant::now() + wait;
                // Quiet while it lasts: a line for each of the first 5 attempts, then every 10th.
                if hold.attempts <= 5 || hold.attempts.is_multiple_of(10) {
                    tracing::warn!(reader = %self.spec().name, attempts = hold.attempts, retry_in_ms = wait.as_millis() as u64, "still failing: {failure}");
                }
                self.core.shared.metrics.retries.increment(1);
                self.core.shared.health.hold(failure.to_string());
                self.hold = Some(hold);
            }
        }
    }

    pub(super) fn recovered(&mut self, hold: &Hold) {
        tracing::info!(
            reader = %self.spec().name,
            attempts = hold.attempts,
            held_ms = hold.since.elapsed().as_millis() as u64,
            "recovered: the held step went through"
        );
        self.backoff.reset();
        self.core.shared.paused.store(false, Ordering::Relaxed);
        if let Err(err) = self
            .consumer
            .assignment()
            .and_then(|a| self.consumer.resume(&a))
        {
            tracing::warn!("resuming partitions: {err}");
        }
        self.core.shared.metrics.retrying.set(0.0);
        self.core.shared.health.release();
        self.release_offsets();
    }
}
