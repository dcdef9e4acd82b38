//! The connector keeper: restarts a FAILED connector or task, with backoff.
//!
//! Kafka Connect never restarts a task that failed: it stays FAILED, and CDC with it,
//! until someone calls the REST API. Debezium retries what it knows to be transient
//! (a lost connection, PostgreSQL down) inside the task, but an error it does not
//! classify, such as "Couldn't get timestamp utils from underlying connection" during a
//! PostgreSQL restart, or a record the broker refused, fails the task for good. The
//! auditor already reads the connector's status every check, so it also does what an
//! operator would: `POST /connectors/{name}/restart?includeTasks=true&onlyFailed=true`.
//!
//! - The first restart comes at the first check that sees FAILED; each next one after a
//!   wait that doubles from `audit.connector_restart_backoff_ms` up to
//!   `audit.connector_restart_max_backoff_ms`. A cause a restart cannot cure (a poison
//!   record) costs one restart per max backoff, and `connector_not_running` fires.
//! - The wait falls back to its start once the connector has run for as long as the
//!   current wait: a restart that held that long was a cure, not a flap.
//! - Only FAILED is restarted. PAUSED and STOPPED are an operator's choice, and
//!   UNASSIGNED or RESTARTING are Connect's own business.
//!
//! Each restart is counted (`audit_connector_restarts_total{outcome}`), raises the
//! event alarm `connector_restarted` with the task's error, and shows on `/report`.

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Serialize;
use tokio::time::Instant;

/// What the keeper did last, for `/report`.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Restart {
    pub at: DateTime<Utc>,
    /// `accepted`, `refused` (Connect answered an error) or `unreachable`.
    pub outcome: &'static str,
    /// Connect's answer, or the error.
    pub answer: String,
}

/// What the keeper knows, for `/report`.
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct KeeperReport {
    pub enabled: bool,
    /// Restarts asked of Connect since the auditor started.
    pub restarts: u64,
    pub last: Option<Restart>,
    /// How long the keeper waits after its next restart, before another.
    pub backoff_ms: u64,
}

/// What to do about the connector this check.
#[derive(Debug, PartialEq, Eq)]
pub enum Action {
    Nothing,
    Restart,
}

/// The keeper's timing. It is told each status and whether its restarts were accepted;
/// the HTTP call is the checker's.
pub struct Keeper {
    enabled: bool,
    first: Duration,
    max: Duration,
    /// The wait after the next restart.
    backoff: Duration,
    /// No restart before this.
    not_before: Option<Instant>,
    /// Since when the connector and every task has been RUNNING.
    running_since: Option<Instant>,
    restarts: u64,
    last: Option<Restart>,
}

/// What a restart request came to (`audit_connector_restarts_total{outcome}`): Connect
/// took it, refused it, or did not answer.
pub const ACCEPTED: &str = "accepted";
pub const REFUSED: &str = "refused";
pub const UNREACHABLE: &str = "unreachable";
const OUTCOMES: [&str; 3] = [ACCEPTED, REFUSED, UNREACHABLE];

impl Keeper {
    pub fn new(enabled: bool, first: Duration, max: Duration) -> Self {
        // At 0 from the start, so ChatpipeConnectorRestarting's increase() sees the
        // first restarts.
        for outcome in OUTCOMES {
            metrics::counter!("audit_connector_restarts_total", "outcome" => outcome).increment(0);
        }
        Self {
            enabled,
            first,
            max: max.max(first),
            backoff: first,
            not_before: None,
            running_since: None,
            restarts: 0,
            last: None,
        }
    }

    /// Given the connector's state this check: restart it now or not.
    pub fn decide(&mut self, running: bool, failed: bool, now: Instant) -> Action {
        if running {
            let since = *self.running_since.get_or_insert(now);
            if now.duration_since(since) >= self.backoff && self.backoff != self.first {
                self.backoff = self.first;
                self.not_before = None;
            }
            return Action::Nothing;
        }
        self.running_since = None;
        if !self.enabled || !failed || self.not_before.is_some_and(|t| now < t) {
            return Action::Nothing;
        }
        Action::Restart
    }

    /// The restart was asked at `now`, with this outcome.
    pub fn restarted(&mut self, outcome: &'static str, answer: String, now: Instant) {
        self.restarts += 1;
        self.last = Some(Restart {
            at: Utc::now(),
            outcome,
            answer,
        });
        self.not_before = Some(now + self.backoff);
        self.backoff = (self.backoff * 2).min(self.max);
        metrics::counter!("audit_connector_restarts_total", "outcome" => outcome).increment(1);
    }

    pub fn report(&self) -> KeeperReport {
        KeeperReport {
            enabled: self.enabled,
            restarts: self.restarts,
            last: self.last.clone(),
            backoff_ms: self.backoff.as_millis() as u64,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    fn keeper() -> Keeper {
        Keeper::new(true, 10 * S, 40 * S)
    }

    #[test]
    fn restarts_a_failed_connector_at_once_then_at_doubling_waits_up_to_the_max() {
        let mut k = keeper();
        let t0 = Instant::now();
        let mut restarts = Vec::new();
        for s in 0..200 {
            let now = t0 + s * S;
            if k.decide(false, true, now) == Action::Restart {
                k.restarted("accepted", String::new(), now);
                restarts.push(s);
            }
        }
        assert_eq!(restarts, [0, 10, 30, 70, 110, 150, 190]);
        assert_eq!(k.report().restarts, 7);
    }

    #[test]
    fn leaves_alone_what_did_not_fail_and_everything_when_disabled() {
        let t0 = Instant::now();
        let mut k = keeper();
        assert_eq!(k.decide(true, false, t0), Action::Nothing);
        // PAUSED, STOPPED, UNASSIGNED, RESTARTING: not running, not failed.
        assert_eq!(k.decide(false, false, t0), Action::Nothing);
        let mut off = Keeper::new(false, 10 * S, 40 * S);
        assert_eq!(off.decide(false, true, t0), Action::Nothing);
        assert!(!off.report().enabled);
    }

    #[test]
    fn the_wait_starts_over_once_the_connector_ran_as_long_as_the_wait() {
        let mut k = keeper();
        let t0 = Instant::now();
        assert_eq!(k.decide(false, true, t0), Action::Restart);
        k.restarted("accepted", String::new(), t0);
        assert_eq!(k.decide(false, true, t0 + 10 * S), Action::Restart);
        k.restarted("accepted", String::new(), t0 + 10 * S);
        assert_eq!(k.report().backoff_ms, 40_000);
        // It runs 15 s, less than the 40 s wait, and fails again: a flap. The next
        // restart waits the 20 s owed since the last one.
        assert_eq!(k.decide(true, false, t0 + 11 * S), Action::Nothing);
        assert_eq!(k.decide(true, false, t0 + 26 * S), Action::Nothing);
        assert_eq!(k.decide(false, true, t0 + 27 * S), Action::Nothing);
        assert_eq!(k.decide(false, true, t0 + 30 * S), Action::Restart);
        k.restarted("accepted", String::new(), t0 + 30 * S);
        // This one holds 40 s: a cure. The next failure is restarted at once, and the
        // wait after it is back to 10 s.
        assert_eq!(k.decide(true, false, t0 + 31 * S), Action::Nothing);
        assert_eq!(k.decide(true, false, t0 + 71 * S), Action::Nothing);
        assert_eq!(k.report().backoff_ms, 10_000);
        assert_eq!(k.decide(false, true, t0 + 72 * S), Action::Restart);
        k.restarted("accepted", String::new(), t0 + 72 * S);
        assert_eq!(k.decide(false, true, t0 + 81 * S), Action::Nothing);
        assert_eq!(k.decide(false, true, t0 + 82 * S), Action::Restart);
    }
}
