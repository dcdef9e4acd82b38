//! PostgreSQL's topology, as the auditor sees it when `audit.postgres_nodes` lists the
//! servers of a primary and its standbys (each asked directly, not through the address
//! that follows the primary): which one is primary, the timeline it writes, how far each
//! standby is behind it, and whether the standby holds a usable copy of the connector's
//! replication slot (a promoted standby streams on from it; without one, the events
//! after the failover's position are lost: docs/operations.md, "PostgreSQL with a
//! synchronous standby").
//!
//! Every query is one any login may run (no `pg_monitor`): `pg_is_in_recovery()`, the
//! WAL positions, `pg_control_checkpoint()` and `pg_replication_slots`.
//!
//! Lag in seconds is measured against the primary's own positions: each check remembers
//! the primary's WAL position and when it was read; a standby is as many seconds behind
//! as the oldest remembered position it has not replayed. No clock of the standby's is
//! involved, and an idle primary is not mistaken for a lagging standby.

use std::collections::VecDeque;
use std::time::Duration;

use serde::Serialize;
use sqlx::postgres::PgPoolOptions;
use sqlx::PgPool;
use tokio::time::Instant;

use super::alarm;
use super::alarms::Alarms;
use crate::settings::{AuditSettings, Settings};

/// One node's answer.
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeReport {
    /// `host:port` as configured.
    pub node: String,
    /// `primary`, `standby`, or `down` (it did not answer; `error` says why).
    pub role: &'static str,
    /// The primary's: the WAL it writes; a standby's: its last checkpoint's.
    pub timeline: Option<i32>,
    /// The primary's current WAL position, or what the standby has replayed (bytes).
    pub lsn: Option<i64>,
    /// A standby's: WAL the primary has and it has not replayed.
    pub lag_bytes: Option<i64>,
    /// A standby's: how long ago the primary was at the oldest position it lacks.
    pub lag_seconds: Option<f64>,
    /// A standby's copy of the connector's slot.
    pub slot: Option<SlotCopy>,
    pub error: Option<String>,
}

/// A standby's copy of the connector's replication slot.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SlotCopy {
    pub exists: bool,
    /// Kept by `sync_replication_slots` from the primary's failover slot.
    pub synced: bool,
    /// A synced copy stays temporary (dropped at promotion) until the primary's slot
    /// has moved past where the standby started.
    pub temporary: bool,
    pub invalidated: bool,
    /// Synced, persistent and valid: a promotion keeps it.
    pub usable: bool,
}

#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TopologyReport {
    pub nodes: Vec<NodeReport>,
    pub primaries: usize,
    pub standbys: usize,
    /// The primary's timeline at the last check.
    pub timeline: Option<i32>,
}

struct Node {
    addr: String,
    pool: PgPool,
}

pub struct Topology {
    nodes: Vec<Node>,
    slot: String,
    /// The primary's (WAL position, when read), oldest first, for lag in seconds.
    samples: VecDeque<(i64, Instant)>,
    timeline: Option<i32>,
}

/// What one node says, in one statement.
type Answer = (bool, i64, Option<i32>);

const NODE_QUERY: &str = "SELECT pg_is_in_recovery(),
        (CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn() ELSE pg_current_wal_lsn() END
           - '0/0'::pg_lsn)::bigint,
        CASE WHEN pg_is_in_recovery() THEN (SELECT timeline_id FROM pg_control_checkpoint())
             ELSE ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::int END";

const SLOT_QUERY: &str = "SELECT synced, temporary, invalidation_reason IS NOT NULL
       FROM pg_replication_slots WHERE slot_name = $1";

/// How long the primary's positions are remembered: lag beyond it reads as this much.
const SAMPLES_KEPT: Duration = Duration::from_secs(3600);

impl Topology {
    /// `None` when `audit.postgres_nodes` is empty (one server: nothing to watch).
    pub fn new(settings: &Settings) -> anyhow::Result<Option<Self>> {
        let cfg = &settings.audit;
        if cfg.postgres_nodes.is_empty() {
            return Ok(None);
        }
        let base = chatpipe_core::db::connect_options(&settings.database.url, "pipeline-audit")?;
        let nodes = cfg
            .postgres_nodes
            .iter()
            .map(|addr| {
                let (host, port) = addr
                    .rsplit_once(':')
                    .and_then(|(h, p)| Some((h, p.parse::<u16>().ok()?)))
                    .ok_or_else(|| {
                        anyhow::anyhow!("audit.postgres_nodes: {addr:?} is not host:port")
                    })?;
                let pool = PgPoolOptions::new()
                    .max_connections(1)
                    .acquire_timeout(Duration::from_millis(cfg.probe_timeout_ms))
                    .connect_lazy_with(base.clone().host(host).port(port));
                Ok(Node {
                    addr: addr.clone(),
                    pool,
                })
            })
            .collect::<anyhow::Result<_>>()?;
        Ok(Some(Self {
            nodes,
            slot: cfg.slot.clone(),
            samples: VecDeque::new(),
            timeline: None,
        }))
    }

    /// Asks every node, concurrently, then works out lag against the primary.
    pub async fn read(&mut self, timeout: Duration) -> TopologyReport {
        let asks = self.nodes.iter().map(|n| async {
            let answer = tokio::time::timeout(timeout, ask(&n.pool, &self.slot)).await;
            match answer {
                Ok(Ok(a)) => Ok(a),
                Ok(Err(e)) => Err(e.to_string()),
                Err(_) => Err(format!("no answer within {timeout:?}")),
            }
        });
        let answers = futures::future::join_all(asks).await;
        let now = Instant::now();
        let primary_lsn = answers
            .iter()
            .find_map(|a| a.as_ref().ok().filter(|(a, _)| !a.0).map(|(a, _)| a.1));
        if let Some(lsn) = primary_lsn {
            self.samples.push_back((lsn, now));
            while self
                .samples
                .front()
                .is_some_and(|(_, t)| now.duration_since(*t) > SAMPLES_KEPT)
            {
                self.samples.pop_front();
            }
        }
        let mut report = TopologyReport::default();
        for (node, answer) in self.nodes.iter().zip(answers) {
            let base = NodeReport {
                node: node.addr.clone(),
                ..NodeReport::default()
            };
            report.nodes.push(match answer {
                Err(error) => NodeReport {
                    role: "down",
                    error: Some(error),
                    ..base
                },
                Ok(((false, lsn, timeline), _)) => {
                    report.timeline = timeline;
                    NodeReport {
                        role: "primary",
                        timeline,
                        lsn: Some(lsn),
                        ..base
                    }
                }
                Ok(((true, replayed, timeline), slot)) => NodeReport {
                    role: "standby",
                    timeline,
                    lsn: Some(replayed),
                    lag_bytes: primary_lsn.map(|p| (p - replayed).max(0)),
                    lag_seconds: primary_lsn.map(|_| self.lag_seconds(replayed, now)),
                    slot,
                    ..base
                },
            });
        }
        let count = |role| report.nodes.iter().filter(|n| n.role == role).count();
        report.primaries = count("primary");
        report.standbys = count("standby");
        report
    }

    /// How long ago the primary was at the oldest remembered position past `replayed`.
    fn lag_seconds(&self, replayed: i64, now: Instant) -> f64 {
        self.samples
            .iter()
            .find(|(lsn, _)| *lsn > replayed)
            .map_or(0.0, |(_, t)| now.duration_since(*t).as_secs_f64())
    }

    /// The topology's alarms and gauges.
    pub fn judge(
        &mut self,
        report: &TopologyReport,
        cfg: &AuditSettings,
        alarms: &mut Alarms,
        now: Instant,
    ) {
        alarms.condition(
            alarm::SPLIT_BRAIN,
            report.primaries > 1,
            Duration::ZERO,
            format!(
                "{} servers answer as primary: {}",
                report.primaries,
                nodes_with(report, "primary")
            ),
            now,
        );
        let missing = report.standbys == 0 || report.nodes.iter().any(|n| n.role == "down");
        alarms.condition(
            alarm::STANDBY_DOWN,
            missing,
            Duration::from_millis(cfg.standby_down_alert_ms),
            format!(
                "standbys answering: {}; down: {}",
                nodes_with(report, "standby"),
                report
                    .nodes
                    .iter()
                    .filter(|n| n.role == "down")
                    .map(|n| format!("{} ({})", n.node, n.error.as_deref().unwrap_or("")))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            now,
        );
        let standbys = report.nodes.iter().filter(|n| n.role == "standby");
        let lagging: Vec<String> = standbys
            .clone()
            .filter(|n| {
                n.lag_bytes.is_some_and(|b| b > cfg.standby_lag_alert_bytes)
                    || n.lag_seconds
                        .is_some_and(|s| s * 1e3 > cfg.standby_lag_alert_ms as f64)
            })
            .map(|n| {
                format!(
                    "{}: {} bytes, {:.1} s behind",
                    n.node,
                    n.lag_bytes.unwrap_or(0),
                    n.lag_seconds.unwrap_or(0.0)
                )
            })
            .collect();
        alarms.condition(
            alarm::STANDBY_LAG,
            !lagging.is_empty(),
            Duration::ZERO,
            lagging.join("; "),
            now,
        );
        let unsynced: Vec<String> = standbys
            .clone()
            .filter(|n| !n.slot.as_ref().is_some_and(|s| s.usable))
            .map(|n| format!("{}: {:?}", n.node, n.slot))
            .collect();
        alarms.condition(
            alarm::SLOT_NOT_SYNCED,
            !unsynced.is_empty(),
            Duration::from_millis(cfg.slot_sync_alert_ms),
            format!(
                "no usable copy of slot {} (a failover would lose the events after it): {}",
                self.slot,
                unsynced.join("; ")
            ),
            now,
        );
        if let Some(timeline) = report.timeline {
            if self.timeline.is_some_and(|t| t != timeline) {
                alarms.event(
                    alarm::TIMELINE_CHANGED,
                    format!(
                        "the primary ({}) writes timeline {timeline}, was {}: a failover or switchover",
                        nodes_with(report, "primary"),
                        self.timeline.unwrap_or_default()
                    ),
                    now,
                );
            }
            self.timeline = Some(timeline);
            metrics::gauge!("audit_postgres_timeline").set(timeline as f64);
        }
        record(report);
    }
}

fn nodes_with(report: &TopologyReport, role: &str) -> String {
    let nodes: Vec<&str> = report
        .nodes
        .iter()
        .filter(|n| n.role == role)
        .map(|n| n.node.as_str())
        .collect();
    if nodes.is_empty() {
        "none".into()
    } else {
        nodes.join(", ")
    }
}

/// What a node says, and a standby's copy of the slot (a primary's own slot is the
/// checker's business: `readings::Slot`).
async fn ask(pool: &PgPool, slot: &str) -> Result<(Answer, Option<SlotCopy>), sqlx::Error> {
    let answer: Answer = sqlx::query_as(NODE_QUERY).fetch_one(pool).await?;
    if !answer.0 {
        return Ok((answer, None));
    }
    let copy: Option<(bool, bool, bool)> = sqlx::query_as(SLOT_QUERY)
        .bind(slot)
        .fetch_optional(pool)
        .await?;
    let slot = match copy {
        Some((synced, temporary, invalidated)) => SlotCopy {
            exists: true,
            synced,
            temporary,
            invalidated,
            usable: synced && !temporary && !invalidated,
        },
        None => SlotCopy {
            exists: false,
            synced: false,
            temporary: false,
            invalidated: false,
            usable: false,
        },
    };
    Ok((answer, Some(slot)))
}

/// The topology's gauges: primaries, standbys, and each standby's lag and slot.
fn record(report: &TopologyReport) {
    metrics::gauge!("audit_postgres_primaries").set(report.primaries as f64);
    metrics::gauge!("audit_postgres_standbys").set(report.standbys as f64);
    for n in report.nodes.iter().filter(|n| n.role == "standby") {
        let node = n.node.clone();
        metrics::gauge!("audit_standby_lag_bytes", "node" => node.clone())
            .set(n.lag_bytes.unwrap_or(0) as f64);
        metrics::gauge!("audit_standby_lag_seconds", "node" => node.clone())
            .set(n.lag_seconds.unwrap_or(0.0));
        let usable = n.slot.as_ref().is_some_and(|s| s.usable);
        metrics::gauge!("audit_standby_slot_usable", "node" => node).set(if usable {
            1.0
        } else {
            0.0
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn lag_in_seconds_is_the_age_of_the_oldest_primary_position_not_replayed() {
        let mut t = Topology {
            nodes: Vec::new(),
            slot: "s".into(),
            samples: VecDeque::new(),
            timeline: None,
        };
        let start = Instant::now();
        for (i, lsn) in [100, 200, 300, 400].into_iter().enumerate() {
            t.samples
                .push_back((lsn, start + Duration::from_secs(5 * i as u64)));
        }
        tokio::time::advance(Duration::from_secs(15)).await;
        let now = Instant::now();
        assert_eq!(t.lag_seconds(400, now), 0.0, "caught up");
        assert_eq!(t.lag_seconds(250, now), 5.0, "lacks 300 (read at 10 s)");
        assert_eq!(t.lag_seconds(50, now), 15.0, "lacks everything since 0 s");
    }
}
