//! `pipeline audit`: the check an operator runs in production that nothing was lost.
//!
//! Two tasks share one [`State`]:
//! - the **events reader** (group `audit.group`, on the processor runtime) reads
//!   `chat.events` into the [`ledger::Ledger`]: seq gaps and duplicates per
//!   conversation, `read.updated` moving backwards, and how long each message took from
//!   its COMMIT to the topic (`audit_commit_to_topic_seconds`, from the record's
//!   timestamp);
//! - the **checker** ([`checks`]) looks every `audit.check_interval_ms` at what the
//!   stream cannot show: PostgreSQL ahead of `chat.events` (CDC stalled), the
//!   replication slot, the connector and its tasks on the Connect REST API, the
//!   services' `/readyz`, and the dead-letter topics; its [`keeper`] restarts a
//!   FAILED connector or task.
//!
//! Findings become [`alarms`] (the `audit_alarm{alarm}` gauges) and `GET /report`
//! (JSON, [`report`]), next to `/metrics`, `/healthz` and `/readyz`.

pub mod alarms;
pub mod archive;
pub mod checks;
pub mod cluster;
pub mod judge;
pub mod keeper;
pub mod ledger;
pub mod outbox;
pub mod readings;
pub mod report;
pub mod topology;

use chatpipe_runtime::CancellationToken;
use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use chatpipe_schemas::ChatEvent;
use rdkafka::Message;
use serde::Serialize;
use tokio::time::Instant;

use crate::settings::Settings;
use alarms::Alarms;
use chatpipe_runtime::{
    Decode, Failure, Position, Processor, ReaderHealth, ReaderSpec, Readiness, Supervisor,
    WriterSchemas,
};
use ledger::{Finding, Gap, Ledger, Regression};

/// Alarm names (the `alarm` label of `audit_alarm`).
pub mod alarm {
    pub const SEQ_GAP: &str = "seq_gap";
    pub const READ_REGRESSION: &str = "read_regression";
    pub const CDC_STALLED: &str = "cdc_stalled";
    pub const CONNECTOR_NOT_RUNNING: &str = "connector_not_running";
    pub const CONNECTOR_RESTARTED: &str = "connector_restarted";
    pub const SLOT_INACTIVE: &str = "slot_inactive";
    pub const SLOT_WAL_RETAINED: &str = "slot_wal_retained";
    pub const POSTGRES_UNREACHABLE: &str = "postgres_unreachable";
    pub const PROBE_FAILING: &str = "probe_failing";
    pub const DEAD_LETTERS: &str = "dead_letters";
    pub const UNDER_REPLICATED: &str = "under_replicated_partitions";
    pub const OFFLINE_PARTITIONS: &str = "offline_partitions";
    pub const CONNECTOR_TASK_MOVING: &str = "connector_task_moving";
    pub const OUTBOX_UNCONFIRMED: &str = "outbox_unconfirmed";
    pub const SPLIT_BRAIN: &str = "postgres_split_brain";
    pub const STANDBY_DOWN: &str = "standby_down";
    pub const STANDBY_LAG: &str = "standby_lag";
    pub const SLOT_NOT_SYNCED: &str = "slot_not_synced";
    pub const TIMELINE_CHANGED: &str = "timeline_changed";
    pub const ARCHIVE_LAGGING: &str = "archive_lagging";
}

/// What the events reader has counted since the auditor started.
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Counts {
    pub events: u64,
    pub messages: u64,
    pub gaps: u64,
    /// Seqs inside those gaps.
    pub missing_seqs: u64,
    pub duplicates: u64,
    pub regressions: u64,
    /// Conversations whose record started past seq 1 (before the auditor's start, or
    /// after an eviction): their earlier seqs were not checked.
    pub untracked_starts: u64,
    /// Records the auditor could not decode (fanout dead-letters them).
    pub undecodable: u64,
}

/// Everything the auditor knows, shared by its tasks and `/report`.
pub struct State {
    pub ledger: Ledger,
    pub counts: Counts,
    pub recent_gaps: VecDeque<Gap>,
    pub recent_regressions: VecDeque<Regression>,
    pub alarms: Alarms,
    pub checks: readings::Latest,
    recent: usize,
    event_alarm: Duration,
}

/// The auditor's shared state.
#[derive(Clone)]
pub struct Audit(Arc<Mutex<State>>);

impl Audit {
    pub fn new(settings: &Settings) -> Self {
        let cfg = &settings.audit;
        Self(Arc::new(Mutex::new(State {
            ledger: Ledger::new(cfg.max_tracked_conversations, cfg.max_tracked_members),
            counts: Counts::default(),
            recent_gaps: VecDeque::new(),
            recent_regressions: VecDeque::new(),
            alarms: Alarms::default(),
            checks: readings::Latest::default(),
            recent: cfg.recent,
            event_alarm: Duration::from_millis(cfg.event_alarm_ms),
        })))
    }

    pub fn state(&self) -> MutexGuard<'_, State> {
        self.0.lock().expect("audit state lock")
    }

    /// What `/report` answers.
    pub fn report(&self) -> report::Report {
        let mut state = self.state();
        let event_alarm = state.event_alarm;
        state.alarms.expire(event_alarm, Instant::now());
        report::Report::of(&state)
    }
}

impl State {
    fn observe(&mut self, event: &ChatEvent, appended_ms: Option<i64>) {
        self.counts.events += 1;
        metrics::counter!("audit_events_total").increment(1);
        if let ChatEvent::MessageNew(m) = event {
            self.counts.messages += 1;
            if let Some(appended) = appended_ms {
                let age_ms = appended - m.created_at.timestamp_millis();
                metrics::histogram!("audit_commit_to_topic_seconds")
                    .record(age_ms.max(0) as f64 / 1e3);
            }
        }
        let now = Instant::now();
        match self.ledger.observe(event) {
            Finding::Fine => {}
            Finding::Untracked => {
                self.counts.untracked_starts += 1;
                metrics::counter!("audit_untracked_starts_total").increment(1);
            }
            Finding::Duplicate => {
                self.counts.duplicates += 1;
                metrics::counter!("audit_duplicates_total").increment(1);
            }
            Finding::Gap(gap) => {
                self.counts.gaps += 1;
                self.counts.missing_seqs += gap.missing() as u64;
                metrics::counter!("audit_seq_gaps_total").increment(1);
                metrics::counter!("audit_missing_seqs_total").increment(gap.missing() as u64);
                tracing::error!(
                    conversation = %gap.conversation_id,
                    expected = %gap.expected,
                    found = %gap.found,
                    "seq gap on chat.events"
                );
                let detail = format!(
                    "conversation {}: expected seq {}, found {}",
                    gap.conversation_id, gap.expected, gap.found
                );
                self.alarms.event(alarm::SEQ_GAP, detail, now);
                push_bounded(&mut self.recent_gaps, gap, self.recent);
            }
            Finding::Regression(r) => {
                self.counts.regressions += 1;
                metrics::counter!("audit_read_regressions_total").increment(1);
                tracing::error!(conversation = %r.conversation_id, user = %r.user_id, was = %r.was, now = %r.now, "read.updated moved backwards");
                let detail = format!(
                    "conversation {}, user {}: {} after {}",
                    r.conversation_id, r.user_id, r.now, r.was
                );
                self.alarms.event(alarm::READ_REGRESSION, detail, now);
                push_bounded(&mut self.recent_regressions, r, self.recent);
            }
        }
    }
}

fn push_bounded<T>(queue: &mut VecDeque<T>, item: T, max: usize) {
    queue.push_back(item);
    while queue.len() > max {
        queue.pop_front();
    }
}

/// A chat.events record, when the broker appended it (the record's timestamp, which
/// Connect sets when it produces) and the outbox row it came from.
pub struct Stamped {
    /// The event, or why it does not decode (it reached the topic all the same: its row
    /// is confirmed; fanout dead-letters it).
    pub event: Result<ChatEvent, String>,
    pub appended_ms: Option<i64>,
    pub outbox_row: Option<uuid::Uuid>,
}

impl Decode for Stamped {
    fn decode(message: &impl Message, schemas: &mut WriterSchemas) -> Result<Self, Failure> {
        let event = match ChatEvent::decode(message, schemas) {
            Ok(event) => Ok(event),
            Err(Failure::Poison(reason)) => Err(reason),
            Err(retriable) => return Err(retriable),
        };
        Ok(Self {
            event,
            appended_ms: message.timestamp().to_millis(),
            outbox_row: outbox::row_id(message),
        })
    }
}

/// The events reader's processor: the ledger, and (with `outbox.retain_until_confirmed`)
/// the outbox rows of the events read deleted before their offsets are committed.
struct Auditor {
    audit: Audit,
    next: std::collections::HashMap<i32, i64>,
    confirmer: Option<outbox::Confirmer>,
}

impl Auditor {
    fn done(&mut self, at: Position, outbox_row: Option<uuid::Uuid>) {
        match &mut self.confirmer {
            Some(confirmer) => confirmer.add(at.partition, at.offset + 1, outbox_row),
            None => {
                self.next.insert(at.partition, at.offset + 1);
            }
        }
    }

    fn flush(&mut self) -> Result<(), Failure> {
        if let Some(confirmer) = &mut self.confirmer {
            self.next.extend(confirmer.flush()?);
        }
        Ok(())
    }
}

impl Processor for Auditor {
    type Record = Stamped;

    fn apply(&mut self, at: Position, record: Stamped) -> Result<(), Failure> {
        match &record.event {
            Ok(event) => self.audit.state().observe(event, record.appended_ms),
            Err(reason) => {
                tracing::warn!(partition = at.partition, offset = at.offset, %reason, "undecodable event");
                self.audit.state().counts.undecodable += 1;
                metrics::counter!("audit_undecodable_total").increment(1);
            }
        }
        self.done(at, record.outbox_row);
        Ok(())
    }

    fn skip(&mut self, at: Position, _key: Option<&[u8]>) {
        self.done(at, None);
    }

    fn tick(&mut self) -> Result<(), Failure> {
        if self.confirmer.as_ref().is_some_and(|c| c.due()) {
            self.flush()?;
        }
        Ok(())
    }

    fn committable(&mut self) -> Vec<(i32, i64)> {
        self.next.drain().collect()
    }

    fn revoke(&mut self, partitions: &[i32]) {
        if let Err(e) = self.flush() {
            tracing::warn!(error = %e, "confirming the outbox before a rebalance failed; the next owner reads those records again");
            if let Some(confirmer) = &mut self.confirmer {
                confirmer.forget(partitions);
            }
        }
    }

    fn finish(&mut self) -> Result<(), Failure> {
        self.flush()
    }
}

/// Adds the auditor's two tasks to `supervisor`. Call from within a tokio runtime (the
/// checker is async).
pub fn spawn(
    settings: &Settings,
    supervisor: &mut Supervisor,
    readiness: &Readiness,
    audit: Audit,
) -> anyhow::Result<()> {
    let health = readiness.reader("audit-events", "audit", settings.readers.stall_after());
    {
        let (settings, audit, health) = (settings.clone(), audit.clone(), health.clone());
        supervisor.spawn_thread("audit-events", move |stop| {
            run_events(&settings, &stop, health, audit)
        });
    }
    let checker = checks::Checker::new(settings, audit, health)?;
    let stop = supervisor.stop();
    supervisor.spawn_async("audit-checks", checker.run(stop));
    Ok(())
}

fn run_events(
    settings: &Settings,
    stop: &CancellationToken,
    health: Arc<ReaderHealth>,
    audit: Audit,
) -> anyhow::Result<()> {
    let cfg = &settings.audit;
    let thread = settings.reader_thread(health)?;
    let mut spec = ReaderSpec::group(
        "audit-events",
        "audit",
        &cfg.events_topic,
        &cfg.group,
        cfg.max_poll_ms,
        &settings.readers,
    );
    // Fanout dead-letters undecodable events; the auditor only counts them.
    spec.dead_letters = None;
    let confirmer = match settings.outbox.retain_until_confirmed {
        true => {
            // sqlx's pool starts its maintenance task on the runtime it is made in.
            let handle = thread.handle();
            let _entered = handle.enter();
            let pool = settings.database.connect_lazy()?;
            Some(outbox::Confirmer::new(cfg, pool, thread.handle()))
        }
        false => None,
    };
    let auditor = Auditor {
        audit,
        next: Default::default(),
        confirmer,
    };
    thread.run(spec, auditor, stop)
}
