//! `resync`: tells every connected client to catch up over REST.
//!
//! A client whose socket stays open through an outage never learns by itself that pushes
//! were lost: fanout drops lists older than `fanout.max_age_ms`, and pushes nobody while
//! a user's presence lease has expired. The gateway knows when either may have happened
//! to its sessions, and says so once it is healthy again:
//! - **presence**: its presence records went unacknowledged for a whole lease, so fanout
//!   may count its users offline. Once the broker acknowledges again, the gateway renews
//!   every lease at once, and after that acknowledgement sends the frame;
//! - **deliveries**: its `chat.deliveries` reader was stalled (`/readyz` 503, for
//!   `readers.stall_after_ms` at least). Sent when the reader is healthy again.
//!
//! The frame: `{"type":"resync","reason":"…"}`, the reason one of the fixed sentences of
//! [`Cause`]: what went wrong inside (broker addresses, librdkafka's errors) is for the
//! log, never for clients. A client answers it as it answers a reconnect: `GET /sync`
//! (docs/protocol.md). One outage may bring more than one.

use std::time::Duration;

use chatpipe_runtime::Readiness;
use tokio::time::Instant;

use crate::frames::Frame;
use crate::sessions::Sessions;

/// The frame's `type`.
pub const RESYNC: &str = "resync";

/// Why clients are told to resync.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cause {
    /// Presence records went unacknowledged for a whole lease.
    Presence,
    /// The `chat.deliveries` reader was stalled.
    Deliveries,
}

impl Cause {
    /// The label of `gateway_resyncs_total`.
    pub fn label(self) -> &'static str {
        match self {
            Self::Presence => "presence",
            Self::Deliveries => "deliveries",
        }
    }

    /// What the client reads: fixed, nothing of the gateway's insides.
    pub fn reason(self) -> &'static str {
        match self {
            Self::Presence => "pushes may have been lost: this gateway could not renew its presence for a whole lease",
            Self::Deliveries => "pushes may have been lost: this gateway's deliveries stalled",
        }
    }
}

/// Sends the frame to every session; returns how many got it. `detail` goes to the log.
pub fn broadcast(sessions: &Sessions, cause: Cause, detail: &str) -> usize {
    let frame = Frame::Resync {
        reason: cause.reason(),
    }
    .text();
    let sent = sessions.push(&sessions.online(), &frame);
    metrics::counter!("gateway_resyncs_total", "cause" => cause.label()).increment(1);
    metrics::counter!("gateway_resync_frames_total").increment(sent as u64);
    tracing::info!(cause = cause.label(), sessions = sent, "resync: {detail}");
    sent
}

/// Whether fanout may have let this gateway's leases expire: no presence record was
/// acknowledged for a whole lease.
#[derive(Debug)]
pub struct Lapse {
    lease: Duration,
    acked_at: Instant,
    since: Option<Instant>,
}

impl Lapse {
    pub fn new(lease: Duration, now: Instant) -> Self {
        Self {
            lease,
            acked_at: now,
            since: None,
        }
    }

    /// A publish was not acknowledged (in time, or at all).
    pub fn unacknowledged(&mut self, now: Instant) {
        if now.duration_since(self.acked_at) >= self.lease {
            self.since.get_or_insert(now);
        }
    }

    /// A publish was acknowledged. `Some(how long since the last acknowledgement)` when
    /// the leases had lapsed: every lease must be renewed, then clients told.
    pub fn acknowledged(&mut self, now: Instant) -> Option<Duration> {
        let silent = now.duration_since(self.acked_at);
        self.acked_at = now;
        self.since.take().map(|_| silent)
    }

    /// The renewal of every lease after a lapse was not acknowledged: still lapsed.
    pub fn still_lapsed(&mut self, now: Instant) {
        self.since.get_or_insert(now);
    }
}

/// Watches the readers of `readiness` (the gateway's deliveries reader): once one that
/// was stalled is healthy again, every session is told to resync. Runs until `stop`.
pub async fn watch_readers(
    readiness: Readiness,
    sessions: Sessions,
    every: Duration,
    stop: impl std::future::Future<Output = ()>,
) {
    let mut stalled: Option<(Instant, String)> = None;
    let mut tick = tokio::time::interval(every);
    tokio::pin!(stop);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            () = &mut stop => return,
        }
        let reports = readiness.report();
        match reports.iter().find(|r| r.stalled) {
            Some(r) => {
                if stalled.is_none() {
                    let why = r.reason.clone().unwrap_or_else(|| "stalled".into());
                    stalled = Some((Instant::now(), format!("{}: {why}", r.reader)));
                }
            }
            None => {
                if let Some((since, why)) = stalled.take() {
                    let reason = format!(
                        "pushes may have been lost: {why} (healthy again after {:.1} s)",
                        since.elapsed().as_secs_f64()
                    );
                    broadcast(&sessions, Cause::Deliveries, &reason);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn a_lapse_is_a_whole_lease_without_an_acknowledgement() {
        let t0 = Instant::now();
        let mut lapse = Lapse::new(3 * S, t0);
        // Slow acknowledgements inside a lease: no lapse.
        lapse.unacknowledged(t0 + S);
        lapse.unacknowledged(t0 + 2 * S);
        assert_eq!(lapse.acknowledged(t0 + 2 * S), None);
        // Nothing acknowledged for 3 s from there on: lapsed.
        lapse.unacknowledged(t0 + 4 * S);
        lapse.unacknowledged(t0 + 5 * S);
        assert_eq!(lapse.acknowledged(t0 + 9 * S), Some(7 * S));
        assert_eq!(lapse.acknowledged(t0 + 10 * S), None);
    }

    #[test]
    fn a_renewal_after_a_lapse_that_fails_keeps_it_lapsed() {
        let t0 = Instant::now();
        let mut lapse = Lapse::new(3 * S, t0);
        lapse.unacknowledged(t0 + 5 * S);
        assert!(lapse.acknowledged(t0 + 6 * S).is_some());
        lapse.still_lapsed(t0 + 6 * S);
        assert!(lapse.acknowledged(t0 + 7 * S).is_some());
    }
}
