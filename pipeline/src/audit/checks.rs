//! The auditor's periodic checks of what `chat.events` cannot show by itself.
//!
//! - **CDC behind**: the `last_seq` in PostgreSQL of the conversations the auditor
//!   streamed most recently (`audit.cdc_sample`, primary-key lookups) and the newest
//!   conversation id, against what reached `chat.events`. Each commit seen ahead is
//!   remembered with the time it was first seen; `cdc_stalled` fires when one is still
//!   not on the topic `audit.cdc_lag_alert_ms` later. Only while the auditor itself is
//!   caught up with the topic (otherwise its own lag would look like CDC's).
//! - **The replication slot**: active, and the WAL it retains.
//! - **The connector**: its state and its tasks', from the Connect REST API. A FAILED
//!   one is restarted by the [`keeper`](super::keeper), with backoff.
//! - **Probes**: the services' `/readyz` (a gateway whose reader stalled answers 503).
//! - **Dead letters**: the end offsets of the `.dlq` topics; growth is an event alarm.
//!
//! This module reads; [`super::judge`] decides what the readings mean.

use chatpipe_runtime::CancellationToken;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use chatpipe_core::db;
use chatpipe_core::kafka::{BaseConsumer, CreateGuarded};
use chatpipe_schemas::{ConversationId, Seq};
use chrono::Utc;
use rdkafka::consumer::Consumer;
use serde::Deserialize;
use sqlx::PgPool;
use tokio::time::Instant;

use super::cluster::{Replication, TaskMoves};
use super::judge::{evaluate, record, Memory, Readings};
use super::keeper::{self, Action, Keeper, KeeperReport};
use super::outbox::Backlog;
use super::readings::{Cdc, Connector, Probe, Slot};
use super::topology::Topology;
use super::Audit;
use crate::settings::{AuditSettings, Settings};
use chatpipe_runtime::ReaderHealth;

/// The Connect REST answer of `GET /connectors/{name}/status`, the parts we read.
#[derive(Deserialize)]
struct ConnectStatus {
    connector: ConnectState,
    #[serde(default)]
    tasks: Vec<ConnectState>,
}

#[derive(Deserialize)]
struct ConnectState {
    state: String,
    #[serde(default)]
    worker_id: Option<String>,
    /// The stack trace of a FAILED one.
    #[serde(default)]
    trace: Option<String>,
}

/// One round's reads for the CDC check.
struct CdcRead {
    sample: Vec<(ConversationId, Seq)>,
    newest_streamed: Option<ConversationId>,
    in_postgres: Vec<(i64, i64)>,
    newest_in_postgres: Option<i64>,
}

pub struct Checker {
    cfg: AuditSettings,
    /// `outbox.retain_until_confirmed`: what is left in the outbox is looked at.
    outbox_retained: bool,
    topology: Option<Topology>,
    audit: Audit,
    health: Arc<ReaderHealth>,
    pool: PgPool,
    http: reqwest::Client,
    kafka: Arc<BaseConsumer>,
    /// Commits seen in PostgreSQL ahead of the topic: the seq and when first seen.
    unstreamed: HashMap<ConversationId, (i64, Instant)>,
    newest_unstreamed: Option<(i64, Instant)>,
    probe_failing_since: HashMap<String, Instant>,
    dead_letter_ends: HashMap<String, i64>,
    keeper: Keeper,
    task_moves: TaskMoves,
    /// The archiver's lag (`audit.archive_group`; `None` when empty).
    archive: Option<Arc<super::archive::Watch>>,
}

impl Checker {
    pub fn new(
        settings: &Settings,
        audit: Audit,
        health: Arc<ReaderHealth>,
    ) -> anyhow::Result<Self> {
        // Lazy: PostgreSQL being down at start is a finding (postgres_unreachable).
        let pool = settings.database.connect_lazy()?;
        let kafka = settings
            .kafka
            .client()
            .create_guarded()
            .expect("a Kafka client (kafka.brokers)");
        Ok(Self {
            cfg: settings.audit.clone(),
            outbox_retained: settings.outbox.retain_until_confirmed,
            topology: Topology::new(settings)?,
            audit,
            health,
            pool,
            http: reqwest::Client::builder()
                .timeout(Duration::from_millis(settings.audit.probe_timeout_ms))
                .build()
                .expect("an HTTP client"),
            kafka: Arc::new(kafka),
            unstreamed: HashMap::new(),
            newest_unstreamed: None,
            probe_failing_since: HashMap::new(),
            dead_letter_ends: HashMap::new(),
            keeper: Keeper::new(
                settings.audit.connector_restart,
                Duration::from_millis(settings.audit.connector_restart_backoff_ms),
                Duration::from_millis(settings.audit.connector_restart_max_backoff_ms),
            ),
            task_moves: TaskMoves::default(),
            archive: (!settings.audit.archive_group.is_empty())
                .then(|| super::archive::Watch::new(&settings.kafka.client(), &settings.audit))
                .transpose()?
                .map(Arc::new),
        })
    }

    /// Checks every `audit.check_interval_ms` until `stop` is set.
    pub async fn run(mut self, stop: CancellationToken) -> anyhow::Result<()> {
        let every = Duration::from_millis(self.cfg.check_interval_ms);
        while !stop.is_cancelled() {
            self.check().await;
            tokio::select! {
                () = tokio::time::sleep(every) => {}
                () = stop.cancelled() => {}
            }
        }
        Ok(())
    }

    /// One round of every check: read, then judge; updates the alarms and the latest
    /// results.
    pub async fn check(&mut self) {
        let now = Instant::now();
        let readings = self.read(now).await;
        let mut state = self.audit.state();
        let state = &mut *state;
        let mut memory = Memory {
            dead_letter_ends: &mut self.dead_letter_ends,
            topology: self.topology.as_mut(),
        };
        state.checks = evaluate(&self.cfg, &mut memory, readings, &mut state.alarms, now);
        record(&state.checks);
    }

    /// Every reading of one round, concurrently (one that waits for a timeout does not
    /// delay the others); a FAILED connector restarted when the keeper says so.
    async fn read(&mut self, now: Instant) -> Readings {
        let mut topology = self.topology.take();
        let timeout = Duration::from_millis(self.cfg.probe_timeout_ms);
        let (cdc, slot, connector, answers, dead_letters, replication, outbox, nodes) = tokio::join!(
            self.cdc_read(),
            self.slot(),
            self.connector(),
            self.probe_answers(),
            self.dead_letters(),
            self.replication(),
            self.outbox(),
            async {
                match &mut topology {
                    Some(t) => Some(t.read(timeout).await),
                    None => None,
                }
            }
        );
        self.topology = topology;
        let sampled = cdc
            .as_ref()
            .map(|r| r.in_postgres.clone())
            .unwrap_or_default();
        let archive = self.archive_lag(&sampled).await;
        let cdc = cdc.and_then(|read| self.cdc(read, now));
        let probes = self.probes(answers, now);
        let mut connector = connector;
        let restarted = match self.keeper.decide(connector.running, connector.failed, now) {
            Action::Restart => {
                let (outcome, answer) = self.restart_connector().await;
                self.keeper.restarted(outcome, answer.clone(), now);
                Some(format!(
                    "restarted connector {} ({outcome}: {answer}); it was {} (tasks: {}): {}",
                    connector.name,
                    connector.state,
                    connector.tasks.join(", "),
                    connector.error.as_deref().unwrap_or("no error given")
                ))
            }
            Action::Nothing => None,
        };
        connector.keeper = self.keeper.report();
        let window = Duration::from_millis(self.cfg.task_moves_window_ms);
        connector.task_moves = self
            .task_moves
            .observe(connector.worker.as_deref(), window, now);
        Readings {
            at: Utc::now(),
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
        }
    }

    /// The archiver's lag (`None`: no archiver is watched, or Kafka or PostgreSQL did not
    /// answer, which their own checks report).
    async fn archive_lag(&self, sampled: &[(i64, i64)]) -> Option<super::archive::ArchiveLag> {
        let watch = self.archive.clone()?;
        let timeout = Duration::from_millis(self.cfg.probe_timeout_ms);
        let partitions = tokio::task::spawn_blocking(move || watch.read(timeout))
            .await
            .ok()?
            .map_err(|e| tracing::warn!("reading the archiver's lag: {e:#}"))
            .ok()?;
        let behind = super::archive::read_sample(&self.pool, sampled)
            .await
            .ok()?;
        Some(super::archive::ArchiveLag::of(partitions, &behind))
    }

    /// What is left in the outbox (`None`: rows are not kept, or PostgreSQL did not
    /// answer, which `postgres_unreachable` reports).
    async fn outbox(&self) -> Option<Backlog> {
        if !self.outbox_retained {
            return None;
        }
        Backlog::read(&self.pool).await.ok()
    }

    /// What was streamed of the recent conversations, and what PostgreSQL holds of them.
    async fn cdc_read(&self) -> Result<CdcRead, sqlx::Error> {
        let (sample, newest_streamed) = {
            let state = self.audit.state();
            (
                state.ledger.recent(self.cfg.cdc_sample),
                state.ledger.newest_created(),
            )
        };
        let ids: Vec<i64> = sample.iter().map(|(c, _)| c.get()).collect();
        let in_postgres: Vec<(i64, i64)> =
            sqlx::query_as("SELECT id, last_seq FROM conversation WHERE id = ANY($1)")
                .bind(&ids)
                .fetch_all(&self.pool)
                .await?;
        let newest_in_postgres: Option<i64> =
            sqlx::query_scalar("SELECT max(id) FROM conversation")
                .fetch_one(&self.pool)
                .await?;
        Ok(CdcRead {
            sample,
            newest_streamed,
            in_postgres,
            newest_in_postgres,
        })
    }

    /// Remembers the commits seen ahead of the topic and forgets those that arrived.
    fn cdc(&mut self, read: CdcRead, now: Instant) -> Result<Cdc, sqlx::Error> {
        let CdcRead {
            sample,
            newest_streamed,
            in_postgres,
            newest_in_postgres,
        } = read;

        let streamed: HashMap<ConversationId, Seq> = sample.iter().copied().collect();
        for (id, last_seq) in in_postgres {
            let conversation: ConversationId = db::id(id)?;
            let on_topic = streamed.get(&conversation).map_or(0, |s| s.get());
            if last_seq > on_topic {
                self.unstreamed
                    .entry(conversation)
                    .or_insert((last_seq, now));
            }
        }
        {
            let state = self.audit.state();
            self.unstreamed
                .retain(|c, (seq, _)| state.ledger.last_seq(*c).is_none_or(|s| s.get() < *seq));
        }
        let streamed_newest = newest_streamed.map_or(0, |c| c.get());
        match newest_in_postgres {
            Some(pg) if pg > streamed_newest => {
                self.newest_unstreamed.get_or_insert((pg, now));
            }
            _ => {}
        }
        if self
            .newest_unstreamed
            .is_some_and(|(target, _)| streamed_newest >= target)
        {
            self.newest_unstreamed = None;
        }
        let oldest = self
            .unstreamed
            .values()
            .map(|(_, t)| *t)
            .chain(self.newest_unstreamed.map(|(_, t)| t))
            .min()
            .map_or(0, |t| now.duration_since(t).as_millis() as u64);
        let auditor_lag = self.health.report().lag;
        Ok(Cdc {
            caught_up: auditor_lag == 0,
            auditor_lag,
            sampled: sample.len(),
            unstreamed: self.unstreamed.len() + usize::from(self.newest_unstreamed.is_some()),
            oldest_unstreamed_ms: oldest,
            newest_conversation_in_postgres: newest_in_postgres,
            newest_conversation_streamed: newest_streamed,
        })
    }

    async fn slot(&self) -> Result<Slot, sqlx::Error> {
        let row: Option<(bool, i64)> = sqlx::query_as(
            "SELECT active, coalesce(pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn), 0)::bigint
               FROM pg_replication_slots WHERE slot_name = $1",
        )
        .bind(&self.cfg.slot)
        .fetch_optional(&self.pool)
        .await?;
        Ok(match row {
            Some((active, retained)) => Slot {
                name: self.cfg.slot.clone(),
                exists: true,
                active,
                retained_wal_bytes: retained,
            },
            None => Slot {
                name: self.cfg.slot.clone(),
                exists: false,
                active: false,
                retained_wal_bytes: 0,
            },
        })
    }

    async fn connector(&self) -> Connector {
        let not_running = |state: String| Connector {
            name: self.cfg.connector.clone(),
            running: false,
            state,
            tasks: Vec::new(),
            failed: false,
            error: None,
            keeper: KeeperReport::default(),
            worker: None,
            task_moves: 0,
        };
        let path = format!("connectors/{}/status", self.cfg.connector);
        let response = match self.ask_connect(|url| self.http.get(url), &path).await {
            Ok(r) => r,
            Err(e) => return not_running(format!("Connect did not answer: {e}")),
        };
        if !response.status().is_success() {
            return not_running(format!("Connect answered {}", response.status()));
        }
        match response.json::<ConnectStatus>().await {
            Ok(s) => {
                let failed: Vec<&ConnectState> = std::iter::once(&s.connector)
                    .chain(&s.tasks)
                    .filter(|c| c.state == "FAILED")
                    .collect();
                let error = failed
                    .iter()
                    .find_map(|c| c.trace.as_deref().and_then(first_and_root_cause));
                let failed = !failed.is_empty();
                let worker = s
                    .tasks
                    .first()
                    .filter(|t| t.state == "RUNNING")
                    .and_then(|t| t.worker_id.clone());
                let tasks: Vec<String> = s.tasks.into_iter().map(|t| t.state).collect();
                Connector {
                    name: self.cfg.connector.clone(),
                    running: s.connector.state == "RUNNING"
                        && !tasks.is_empty()
                        && tasks.iter().all(|t| t == "RUNNING"),
                    state: s.connector.state,
                    tasks,
                    failed,
                    error,
                    keeper: KeeperReport::default(),
                    worker,
                    task_moves: 0,
                }
            }
            Err(e) => not_running(format!("unreadable status: {e}")),
        }
    }

    /// Sends a request to the first Connect worker of `audit.connect_url` (a comma-separated
    /// list) that answers: any worker of a cluster serves the connector's status and
    /// forwards a restart to the leader, so one lost worker does not blind the auditor.
    async fn ask_connect(
        &self,
        request: impl Fn(String) -> reqwest::RequestBuilder,
        path: &str,
    ) -> Result<reqwest::Response, reqwest::Error> {
        let mut last = None;
        for base in self.cfg.connect_url.split(',').map(str::trim) {
            match request(format!("{}/{path}", base.trim_end_matches('/')))
                .send()
                .await
            {
                Ok(r) => return Ok(r),
                Err(e) => last = Some(e),
            }
        }
        Err(last.expect("audit.connect_url names at least one worker"))
    }

    /// Asks Connect to restart the connector's FAILED parts (the connector itself, its
    /// tasks, or both): the outcome and Connect's answer.
    async fn restart_connector(&self) -> (&'static str, String) {
        let path = format!(
            "connectors/{}/restart?includeTasks=true&onlyFailed=true",
            self.cfg.connector
        );
        match self.ask_connect(|url| self.http.post(url), &path).await {
            Ok(r) if r.status().is_success() => (keeper::ACCEPTED, r.status().to_string()),
            Ok(r) => {
                let status = r.status();
                let body = r.text().await.unwrap_or_default();
                (
                    keeper::REFUSED,
                    format!("{status} {}", body.chars().take(300).collect::<String>()),
                )
            }
            Err(e) => (
                keeper::UNREACHABLE,
                redact_all(&e.to_string(), &self.cfg.connect_url),
            ),
        }
    }

    /// Each probe's answer: `Ok(status)` for 2xx, `Err(status or error)` otherwise.
    async fn probe_answers(&self) -> Vec<(String, Result<String, String>)> {
        let asks = self.cfg.probes.iter().map(|url| async move {
            let answer = match self.http.get(url).send().await {
                Ok(r) if r.status().is_success() => Ok(r.status().to_string()),
                Ok(r) => Err(r.status().to_string()),
                Err(e) => Err(chatpipe_core::redact::text(&e.to_string(), url)),
            };
            // A probe URL with credentials is shown (labels, the report) without them.
            (chatpipe_core::redact::url(url), answer)
        });
        futures::future::join_all(asks).await
    }

    fn probes(
        &mut self,
        answers: Vec<(String, Result<String, String>)>,
        now: Instant,
    ) -> Vec<Probe> {
        let mut out = Vec::new();
        for (url, answer) in answers {
            let ok = answer.is_ok();
            metrics::gauge!("audit_probe_ok", "target" => url.clone()).set(if ok {
                1.0
            } else {
                0.0
            });
            let failing_ms = if ok {
                self.probe_failing_since.remove(&url);
                0
            } else {
                let since = *self.probe_failing_since.entry(url.clone()).or_insert(now);
                now.duration_since(since).as_millis() as u64
            };
            out.push(Probe {
                url,
                ok,
                answer: answer.unwrap_or_else(|e| e),
                failing_ms,
            });
        }
        out
    }

    /// The watched topics' partitions from the cluster's metadata.
    async fn replication(&self) -> Option<Replication> {
        let (kafka, topics) = (self.kafka.clone(), self.cfg.replicated_topics.clone());
        tokio::task::spawn_blocking(move || {
            super::cluster::read(&kafka, &topics, Duration::from_secs(5))
        })
        .await
        .ok()
        .flatten()
    }

    /// End offsets of the dead-letter topics that exist.
    async fn dead_letters(&self) -> BTreeMap<String, i64> {
        let (kafka, topics) = (self.kafka.clone(), self.cfg.dead_letter_topics.clone());
        tokio::task::spawn_blocking(move || {
            let timeout = Duration::from_secs(5);
            let mut ends = BTreeMap::new();
            for topic in topics {
                let Ok(metadata) = kafka.fetch_metadata(Some(&topic), timeout) else {
                    continue;
                };
                let Some(t) = metadata.topics().first().filter(|t| t.error().is_none()) else {
                    continue;
                };
                let mut end = 0;
                for p in t.partitions() {
                    if let Ok((_, high)) = kafka.fetch_watermarks(&topic, p.id(), timeout) {
                        end += high;
                    }
                }
                ends.insert(topic, end);
            }
            ends
        })
        .await
        .unwrap_or_default()
    }
}

/// A Java stack trace's first line and its last `Caused by:` (the root cause), shortened:
/// "ConnectException: Unrecoverable exception from producer send callback; caused by:
/// RecordTooLargeException: The request included a message larger than ...".
fn first_and_root_cause(trace: &str) -> Option<String> {
    let short = |line: &str| -> String { line.trim().chars().take(300).collect() };
    let first = short(trace.lines().next()?);
    let root = trace
        .lines()
        .filter_map(|l| l.trim().strip_prefix("Caused by: "))
        .next_back();
    Some(match root {
        Some(root) => format!("{first}; caused by: {}", short(root)),
        None => first,
    })
}

/// `text` with the password of every URL in the comma-separated `urls` masked.
fn redact_all(text: &str, urls: &str) -> String {
    urls.split(',').fold(text.to_owned(), |t, url| {
        chatpipe_core::redact::text(&t, url.trim())
    })
}

#[cfg(test)]
mod tests {
    use super::first_and_root_cause;

    #[test]
    fn a_trace_is_told_by_its_first_line_and_its_root_cause() {
        let trace = "org.apache.kafka.connect.errors.ConnectException: Unrecoverable exception from producer send callback\n\tat org.apache.kafka.connect.runtime.WorkerSourceTask.maybeThrowProducerSendException(WorkerSourceTask.java:340)\nCaused by: org.apache.kafka.common.KafkaException: outer\n\tat x\nCaused by: org.apache.kafka.common.errors.RecordTooLargeException: The request included a message larger than the max message size the server will accept.\n";
        assert_eq!(
            first_and_root_cause(trace).unwrap(),
            "org.apache.kafka.connect.errors.ConnectException: Unrecoverable exception from producer send callback; caused by: org.apache.kafka.common.errors.RecordTooLargeException: The request included a message larger than the max message size the server will accept."
        );
        assert_eq!(first_and_root_cause("Boom\n\tat a").unwrap(), "Boom");
        assert_eq!(first_and_root_cause(""), None);
    }
}
