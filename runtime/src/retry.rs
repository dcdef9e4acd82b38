//! Capped exponential backoff with jitter, for a reader waiting out an outage.

use std::time::Duration;
use tokio_util::sync::CancellationToken;

use backon::{BackoffBuilder, ExponentialBackoff, ExponentialBuilder};
use serde::Deserialize;

/// `[readers]`: how every reader of a process waits out outages and when it counts as
/// stalled.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReaderSettings {
    /// First wait after a failure; doubles each time, with jitter.
    pub retry_initial_ms: u64,
    /// The longest wait between two attempts.
    pub retry_max_ms: u64,
    /// `/readyz` answers 503 while a reader has records waiting and has made no progress
    /// for this long, or has not polled for this long.
    pub stall_after_ms: u64,
    /// How long a dead-letter write may wait for the broker before it counts as failed
    /// (and is retried, the bad record held).
    pub dead_letter_timeout_ms: u64,
    /// How often a group reader commits the offsets its processor released.
    pub commit_interval_ms: u64,
    /// A reader that has received nothing for this long asks the broker for the end of
    /// its partitions; records it is not fetching are fetched again (see
    /// `reader::FetchWatch`).
    pub fetch_check_ms: u64,
}

impl ReaderSettings {
    pub fn stall_after(&self) -> Duration {
        Duration::from_millis(self.stall_after_ms)
    }

    pub fn commit_interval(&self) -> Duration {
        Duration::from_millis(self.commit_interval_ms)
    }

    pub fn fetch_check(&self) -> Duration {
        Duration::from_millis(self.fetch_check_ms)
    }
}

/// Runs `attempt` until it succeeds, waiting with backoff between failures (a reader
/// starting while the registry, the broker or the database is down waits for it).
/// `None` if `stop` was set first.
pub fn retry_until<T>(
    stop: &CancellationToken,
    settings: &ReaderSettings,
    what: &str,
    mut attempt: impl FnMut() -> anyhow::Result<T>,
) -> Option<T> {
    let mut backoff = Backoff::new(settings);
    let mut failures = 0u32;
    loop {
        match attempt() {
            Ok(value) => {
                if failures > 0 {
                    tracing::info!(failures, "{what}: ready");
                }
                return Some(value);
            }
            Err(err) => {
                failures += 1;
                let wait = backoff.next_wait();
                tracing::warn!(
                    failures,
                    retry_in_ms = wait.as_millis() as u64,
                    "{what}: {err:#}"
                );
                let until = std::time::Instant::now() + wait;
                while std::time::Instant::now() < until {
                    if stop.is_cancelled() {
                        return None;
                    }
                    std::thread::sleep(Duration::from_millis(50).min(wait));
                }
            }
        }
    }
}

/// The waits between attempts at one failing step: `retry_initial_ms`, doubling up to
/// `retry_max_ms`, each stretched by a random factor in [1, 2) (the growth stops at half
/// the cap, so waits at the cap still vary between half of it and all of it: readers
/// that failed together do not retry together). Never gives up; `reset` after a success.
pub struct Backoff {
    builder: ExponentialBuilder,
    waits: ExponentialBackoff,
    max: Duration,
}

impl Backoff {
    pub fn new(settings: &ReaderSettings) -> Self {
        let max = Duration::from_millis(settings.retry_max_ms.max(1));
        let builder = ExponentialBuilder::default()
            .with_min_delay(Duration::from_millis(settings.retry_initial_ms.max(1)))
            .with_max_delay(max / 2)
            .with_factor(2.0)
            .with_jitter()
            .without_max_times();
        Self {
            waits: builder.build(),
            builder,
            max,
        }
    }

    /// How long to wait before the next attempt.
    pub fn next_wait(&mut self) -> Duration {
        self.waits.next().unwrap_or(self.max).min(self.max)
    }

    /// The step succeeded: the next failure starts from the first wait again.
    pub fn reset(&mut self) {
        self.waits = self.builder.build();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_readers_failing_together_do_not_retry_together() {
        let settings = ReaderSettings {
            retry_initial_ms: 100,
            retry_max_ms: 1_000,
            stall_after_ms: 30_000,
            dead_letter_timeout_ms: 10_000,
            commit_interval_ms: 200,
            fetch_check_ms: 5000,
        };
        let (mut a, mut b) = (Backoff::new(&settings), Backoff::new(&settings));
        let waits_a: Vec<Duration> = (0..8).map(|_| a.next_wait()).collect();
        let waits_b: Vec<Duration> = (0..8).map(|_| b.next_wait()).collect();
        assert_ne!(waits_a, waits_b, "the jitter is seeded per backoff");
    }

    #[test]
    fn waits_grow_to_the_cap_and_start_over_after_a_success() {
        let settings = ReaderSettings {
            retry_initial_ms: 100,
            retry_max_ms: 1_000,
            stall_after_ms: 30_000,
            dead_letter_timeout_ms: 10_000,
            commit_interval_ms: 200,
            fetch_check_ms: 5000,
        };
        let mut backoff = Backoff::new(&settings);
        let waits: Vec<Duration> = (0..12).map(|_| backoff.next_wait()).collect();
        assert!(waits[0] >= Duration::from_millis(100) && waits[0] < Duration::from_millis(200));
        assert!(
            waits.iter().all(|w| *w <= Duration::from_millis(1_000)),
            "capped: {waits:?}"
        );
        assert!(
            waits[8..].iter().all(|w| *w >= Duration::from_millis(500)),
            "grew to the cap: {waits:?}"
        );
        backoff.reset();
        assert!(backoff.next_wait() < Duration::from_millis(200));
    }
}
