//! Judging one round of the auditor's checks: [`evaluate`] turns what
//! [`Checker`](super::checks::Checker) read (PostgreSQL, the slot, Connect, the probes,
//! the dead-letter topics, the cluster's metadata, the outbox, the nodes) into alarms and
//! the report, with no I/O, so each rule is tested like the receipts window is.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::time::Instant;

use super::alarm;
use super::alarms::Alarms;
use super::archive::ArchiveLag;
use super::cluster::Replication;
use super::outbox::Backlog;
use super::readings::{Cdc, Connector, Latest, Probe, Slot};
use super::topology::{Topology, TopologyReport};
use crate::settings::AuditSettings;

/// One round's readings (I/O done), for [`evaluate`].
pub struct Readings {
    pub at: DateTime<Utc>,
    pub cdc: Result<Cdc, sqlx::Error>,
    pub slot: Result<Slot, sqlx::Error>,
    pub connector: Connector,
    /// What the keeper did this round, when it restarted the connector.
    pub restarted: Option<String>,
    pub probes: Vec<Probe>,
    pub dead_letters: BTreeMap<String, i64>,
    pub replication: Option<Replication>,
    pub outbox: Option<Backlog>,
    pub nodes: Option<TopologyReport>,
    pub archive: Option<ArchiveLag>,
}

/// What judging remembers from one round to the next.
pub struct Memory<'a> {
    /// The end offset of each dead-letter topic last round: growth is an event.
    pub dead_letter_ends: &'a mut HashMap<String, i64>,
    /// The primary and standbys seen before (`audit.postgres_nodes`).
    pub topology: Option<&'a mut Topology>,
}

/// Judges one round's `readings` at `now`: moves `alarms` (a condition fires once it
/// has held for its `audit.*_alert_ms`; an event fires at once and expires after
/// `audit.event_alarm_ms`) and returns what `/report` shows. No I/O.
pub fn evaluate(
    cfg: &AuditSettings,
    memory: &mut Memory<'_>,
    readings: Readings,
    alarms: &mut Alarms,
    now: Instant,
) -> Latest {
    let Readings {
        at,
        cdc,
        slot,
        connector,
        restarted,
        probes,
        dead_letters,
        replication,
        outbox,
        nodes,
        archive,
    } = readings;
    let mut judge = Judge { cfg, alarms, now };
    let cdc = judge.postgres(cdc, &slot);
    let slot = slot.ok();
    if let Some(s) = &slot {
        judge.slot(s);
    }
    judge.connector(&connector, restarted);
    if let Some(r) = &replication {
        judge.replication(r);
    }
    judge.probes(&probes);
    judge.dead_letters(memory.dead_letter_ends, &dead_letters);
    if let Some(backlog) = &outbox {
        backlog.judge(cfg, alarms, now);
    }
    if let Some(lag) = &archive {
        lag.judge(cfg, alarms, now);
    }
    if let (Some(t), Some(report)) = (memory.topology.as_deref_mut(), &nodes) {
        t.judge(report, cfg, alarms, now);
    }
    alarms.expire(Duration::from_millis(cfg.event_alarm_ms), now);
    Latest {
        checked_at: Some(at),
        cdc,
        slot,
        connector: Some(connector),
        probes,
        dead_letters,
        replication,
        outbox,
        topology: nodes,
        archive,
    }
}

/// The rules of one round, grouped by what they look at.
struct Judge<'a> {
    cfg: &'a AuditSettings,
    alarms: &'a mut Alarms,
    now: Instant,
}

impl Judge<'_> {
    /// `postgres_unreachable` (either reading failed) and `cdc_stalled`.
    fn postgres(&mut self, cdc: Result<Cdc, sqlx::Error>, slot: &Result<Slot, sqlx::Error>) -> Cdc {
        let (cfg, alarms, now) = (self.cfg, &mut *self.alarms, self.now);
        let pg_error = match (&cdc, slot) {
            (Err(e), _) | (_, Err(e)) => Some(e.to_string()),
            _ => None,
        };
        alarms.condition(
            alarm::POSTGRES_UNREACHABLE,
            pg_error.is_some(),
            Duration::from_millis(cfg.slot_inactive_alert_ms),
            pg_error.unwrap_or_default(),
            now,
        );
        let cdc = cdc.unwrap_or_default();
        let lag_alert = Duration::from_millis(cfg.cdc_lag_alert_ms);
        alarms.condition(
            alarm::CDC_STALLED,
            cdc.caught_up && Duration::from_millis(cdc.oldest_unstreamed_ms) >= lag_alert,
            Duration::ZERO,
            format!(
                "{} commits in PostgreSQL not on chat.events, the oldest seen {} ms ago",
                cdc.unstreamed, cdc.oldest_unstreamed_ms
            ),
            now,
        );
        cdc
    }

    /// `slot_inactive` and `slot_wal_retained`.
    fn slot(&mut self, s: &Slot) {
        let (cfg, alarms, now) = (self.cfg, &mut *self.alarms, self.now);
        alarms.condition(
            alarm::SLOT_INACTIVE,
            !s.active,
            Duration::from_millis(cfg.slot_inactive_alert_ms),
            if s.exists {
                format!("replication slot {} has no client", s.name)
            } else {
                format!("replication slot {} does not exist", s.name)
            },
            now,
        );
        alarms.condition(
            alarm::SLOT_WAL_RETAINED,
            s.retained_wal_bytes > cfg.slot_retained_wal_alert_bytes,
            Duration::ZERO,
            format!(
                "replication slot {} retains {} bytes of WAL",
                s.name, s.retained_wal_bytes
            ),
            now,
        );
    }

    /// `connector_not_running`, `connector_restarted` (the keeper's restart this round)
    /// and `connector_task_moving`.
    fn connector(&mut self, connector: &Connector, restarted: Option<String>) {
        let (cfg, alarms, now) = (self.cfg, &mut *self.alarms, self.now);
        alarms.condition(
            alarm::CONNECTOR_NOT_RUNNING,
            !connector.running,
            Duration::from_millis(cfg.connector_alert_ms),
            format!(
                "connector {}: {} (tasks: {})",
                connector.name,
                connector.state,
                connector.tasks.join(", ")
            ),
            now,
        );
        if let Some(detail) = restarted {
            tracing::warn!("{detail}");
            alarms.event(alarm::CONNECTOR_RESTARTED, detail, now);
        }
        alarms.condition(
            alarm::CONNECTOR_TASK_MOVING,
            connector.task_moves > cfg.task_moves_alert,
            Duration::ZERO,
            format!(
                "the task of connector {} moved between workers {} times in {} s (now on {})",
                connector.name,
                connector.task_moves,
                cfg.task_moves_window_ms / 1000,
                connector.worker.as_deref().unwrap_or("none")
            ),
            now,
        );
    }

    /// `under_replicated_partitions` and `offline_partitions`.
    fn replication(&mut self, r: &Replication) {
        let (cfg, alarms, now) = (self.cfg, &mut *self.alarms, self.now);
        alarms.condition(
            alarm::UNDER_REPLICATED,
            !r.under_replicated.is_empty(),
            Duration::from_millis(cfg.under_replicated_alert_ms),
            format!(
                "{} partitions under-replicated: {}",
                r.under_replicated.len(),
                r.under_replicated.join(", ")
            ),
            now,
        );
        alarms.condition(
            alarm::OFFLINE_PARTITIONS,
            !r.offline.is_empty(),
            Duration::from_millis(cfg.offline_alert_ms),
            format!(
                "{} partitions without a leader: {}",
                r.offline.len(),
                r.offline.join(", ")
            ),
            now,
        );
    }

    /// `probe_failing`: a service's `/readyz` failing for `audit.probe_alert_ms`.
    fn probes(&mut self, probes: &[Probe]) {
        let (cfg, alarms, now) = (self.cfg, &mut *self.alarms, self.now);
        let probe_alert = Duration::from_millis(cfg.probe_alert_ms);
        let failing: Vec<String> = probes
            .iter()
            .filter(|p| Duration::from_millis(p.failing_ms) >= probe_alert)
            .map(|p| format!("{}: {}", p.url, p.answer))
            .collect();
        alarms.condition(
            alarm::PROBE_FAILING,
            !failing.is_empty(),
            Duration::ZERO,
            failing.join("; "),
            now,
        );
    }

    /// `dead_letters`: a dead-letter topic grew since the last round.
    fn dead_letters(
        &mut self,
        ends: &mut HashMap<String, i64>,
        dead_letters: &BTreeMap<String, i64>,
    ) {
        let (alarms, now) = (&mut *self.alarms, self.now);
        for (topic, end) in dead_letters {
            match ends.insert(topic.clone(), *end) {
                Some(before) if *end > before => alarms.event(
                    alarm::DEAD_LETTERS,
                    format!("{topic}: {} new ({end} in all)", end - before),
                    now,
                ),
                _ => {}
            }
        }
    }
}

/// The checks' gauges, from what [`evaluate`] returned.
pub fn record(latest: &Latest) {
    let cdc = &latest.cdc;
    metrics::gauge!("audit_cdc_unstreamed").set(cdc.unstreamed as f64);
    metrics::gauge!("audit_cdc_oldest_unstreamed_seconds")
        .set(cdc.oldest_unstreamed_ms as f64 / 1e3);
    if let Some(s) = &latest.slot {
        metrics::gauge!("audit_slot_active").set(if s.active { 1.0 } else { 0.0 });
        metrics::gauge!("audit_slot_retained_wal_bytes").set(s.retained_wal_bytes as f64);
    }
    if let Some(c) = &latest.connector {
        metrics::gauge!("audit_connector_running").set(if c.running { 1.0 } else { 0.0 });
        metrics::gauge!("audit_connector_task_moves").set(c.task_moves as f64);
    }
    if let Some(r) = &latest.replication {
        metrics::gauge!("audit_under_replicated_partitions").set(r.under_replicated.len() as f64);
        metrics::gauge!("audit_offline_partitions").set(r.offline.len() as f64);
    }
    for (topic, end) in &latest.dead_letters {
        metrics::gauge!("audit_dead_letters", "topic" => topic.clone()).set(*end as f64);
    }
}

#[cfg(test)]
mod evaluate_tests {
    use super::*;
    use crate::audit::keeper::KeeperReport;
    use crate::settings::Settings;

    fn cfg() -> AuditSettings {
        Settings::load(None).expect("pipeline defaults").audit
    }

    /// A round in which everything is well.
    fn healthy() -> Readings {
        Readings {
            at: Utc::now(),
            cdc: Ok(Cdc {
                caught_up: true,
                ..Cdc::default()
            }),
            slot: Ok(Slot {
                name: "chatpipe_outbox".into(),
                exists: true,
                active: true,
                retained_wal_bytes: 1024,
            }),
            connector: Connector {
                name: "chatpipe-outbox".into(),
                running: true,
                state: "RUNNING".into(),
                tasks: vec!["RUNNING".into()],
                failed: false,
                error: None,
                keeper: KeeperReport::default(),
                worker: Some("127.0.0.1:8083".into()),
                task_moves: 0,
            },
            restarted: None,
            probes: vec![],
            dead_letters: BTreeMap::from([("chat.events.dlq".to_owned(), 3)]),
            replication: Some(Replication::default()),
            outbox: None,
            nodes: None,
            archive: None,
        }
    }

    /// Judges rounds one after another with one memory, as the checker does.
    struct Judge {
        cfg: AuditSettings,
        ends: HashMap<String, i64>,
        alarms: Alarms,
        start: Instant,
    }

    impl Judge {
        fn new() -> Self {
            Self {
                cfg: cfg(),
                ends: HashMap::new(),
                alarms: Alarms::default(),
                start: Instant::now(),
            }
        }

        fn round(&mut self, at_ms: u64, readings: Readings) -> Latest {
            let mut memory = Memory {
                dead_letter_ends: &mut self.ends,
                topology: None,
            };
            let now = self.start + Duration::from_millis(at_ms);
            evaluate(&self.cfg, &mut memory, readings, &mut self.alarms, now)
        }

        fn firing(&self) -> Vec<String> {
            self.alarms.firing().into_iter().map(|a| a.name).collect()
        }
    }

    #[test]
    fn a_healthy_round_fires_nothing_and_reports_what_it_read() {
        let mut judge = Judge::new();
        let latest = judge.round(0, healthy());
        assert_eq!(judge.firing(), Vec::<String>::new());
        assert_eq!(latest.slot.unwrap().retained_wal_bytes, 1024);
        assert!(latest.connector.unwrap().running);
        assert_eq!(latest.dead_letters["chat.events.dlq"], 3);
    }

    #[test]
    fn an_inactive_slot_fires_once_it_has_held_for_its_alert_time_and_clears_when_active() {
        let mut judge = Judge::new();
        let hold = judge.cfg.slot_inactive_alert_ms;
        let inactive = || {
            let mut r = healthy();
            r.slot.as_mut().unwrap().active = false;
            r
        };
        judge.round(0, inactive());
        assert!(!judge.alarms.is_firing(alarm::SLOT_INACTIVE), "not yet");
        judge.round(hold - 1, inactive());
        assert!(!judge.alarms.is_firing(alarm::SLOT_INACTIVE), "not yet");
        judge.round(hold, inactive());
        assert_eq!(judge.firing(), vec![alarm::SLOT_INACTIVE]);
        judge.round(hold + 1, healthy());
        assert_eq!(judge.firing(), Vec::<String>::new());
    }

    #[test]
    fn an_archiver_behind_for_its_alert_time_fires_and_clears_when_it_catches_up() {
        use super::super::archive::{ArchiveLag, PartitionLag};
        let mut judge = Judge::new();
        let alert = judge.cfg.archive_lag_alert_ms;
        let behind = |oldest_ms| {
            let mut r = healthy();
            let lag = |partition, records, oldest_ms| PartitionLag {
                partition,
                records,
                oldest_ms,
                seq_behind: 0,
            };
            // Conversation 21's key hashes to partition 0 of 6 (Kafka's murmur2).
            r.archive = Some(ArchiveLag::of(
                vec![lag(0, 0, 0), lag(3, 40, oldest_ms)],
                &[(21, 25)],
            ));
            r
        };
        judge.round(0, behind(alert - 1));
        assert!(!judge.alarms.is_firing(alarm::ARCHIVE_LAGGING));
        let latest = judge.round(1, behind(alert));
        assert_eq!(judge.firing(), vec![alarm::ARCHIVE_LAGGING]);
        let archive = latest.archive.unwrap();
        assert_eq!(archive.partitions[1].records, 40);
        assert_eq!(archive.partitions[0].seq_behind, 25);
        assert_eq!(archive.partitions[1].seq_behind, 0);
        assert_eq!(
            (archive.conversations_behind, archive.max_seq_behind),
            (1, 25)
        );
        judge.round(2, behind(0));
        assert_eq!(judge.firing(), Vec::<String>::new());
    }

    #[test]
    fn postgres_not_answering_fires_after_its_hold_and_the_report_keeps_no_slot() {
        let mut judge = Judge::new();
        let hold = judge.cfg.slot_inactive_alert_ms;
        let down = || {
            let mut r = healthy();
            r.cdc = Err(sqlx::Error::PoolTimedOut);
            r.slot = Err(sqlx::Error::PoolTimedOut);
            r
        };
        let latest = judge.round(0, down());
        assert!(latest.slot.is_none());
        assert!(!judge.alarms.is_firing(alarm::POSTGRES_UNREACHABLE));
        judge.round(hold, down());
        assert_eq!(judge.firing(), vec![alarm::POSTGRES_UNREACHABLE]);
    }

    #[test]
    fn dead_letters_that_grow_are_an_event_that_expires_and_the_first_count_is_not() {
        let mut judge = Judge::new();
        let expire = judge.cfg.event_alarm_ms;
        judge.round(0, healthy());
        assert!(!judge.alarms.is_firing(alarm::DEAD_LETTERS), "3 seen first");
        let mut grown = healthy();
        grown.dead_letters.insert("chat.events.dlq".into(), 5);
        judge.round(1_000, grown);
        let fired = judge.alarms.firing();
        assert_eq!(fired.len(), 1);
        assert_eq!(fired[0].name, alarm::DEAD_LETTERS);
        assert_eq!(fired[0].detail, "chat.events.dlq: 2 new (5 in all)");
        let mut same = healthy();
        same.dead_letters.insert("chat.events.dlq".into(), 5);
        judge.round(1_000 + expire, same);
        assert_eq!(judge.firing(), Vec::<String>::new(), "expired");
    }

    #[test]
    fn a_restart_by_the_keeper_is_an_event_and_a_stopped_connector_a_condition() {
        let mut judge = Judge::new();
        let hold = judge.cfg.connector_alert_ms;
        let failed = |restarted: Option<&str>| {
            let mut r = healthy();
            r.connector.running = false;
            r.connector.failed = true;
            r.connector.state = "FAILED".into();
            r.restarted = restarted.map(str::to_owned);
            r
        };
        judge.round(0, failed(Some("restarted connector chatpipe-outbox")));
        assert_eq!(judge.firing(), vec![alarm::CONNECTOR_RESTARTED]);
        judge.round(hold, failed(None));
        assert_eq!(
            judge.firing(),
            vec![alarm::CONNECTOR_NOT_RUNNING, alarm::CONNECTOR_RESTARTED]
        );
    }
}
