//! `pipeline audit` run in the test's process against a namespace's stack: its topic,
//! database, connector and slot. Its `/report` is served on a free port and read over
//! HTTP, as an operator's tooling would.

use std::time::{Duration, Instant};

use serde_json::Value;

use crate::stream::{connect_url, Pipeline};

impl Pipeline {
    /// Auditor settings for this namespace: its chat.events, database, connector, slot
    /// and dead-letter topics; the alarm thresholds are the shipped defaults.
    pub fn audit_settings(&self) -> pipeline::settings::Settings {
        let mut s = self.receipts_settings();
        s.audit.events_topic = self.topic.clone();
        s.audit.group = format!("{}-audit", self.ns);
        s.audit.connect_url = connect_url();
        s.audit.connector = self.connector.clone();
        s.audit.slot = self.slot.clone();
        s.audit.dead_letter_topics = vec![
            format!("{}.dlq", self.topic),
            format!("{}.dlq", self.receipts_topic),
        ];
        // Checks every second: the alarm thresholds stay the defaults.
        s.audit.check_interval_ms = 1000;
        // No archiver runs unless a test starts one (and names its group).
        s.audit.archive_group = String::new();
        s
    }

    pub async fn start_audit(&self, settings: pipeline::settings::Settings) -> RunningAudit {
        chatpipe_core::telemetry::init_logging();
        let stop = chatpipe_runtime::CancellationToken::new();
        let readiness = chatpipe_runtime::Readiness::default();
        let audit = pipeline::audit::Audit::new(&settings);
        let mut supervisor = chatpipe_runtime::Supervisor::new(stop.clone());
        pipeline::audit::spawn(&settings, &mut supervisor, &readiness, audit.clone())
            .expect("the auditor starts");
        let done = tokio::spawn(supervisor.wait());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let app =
            chatpipe_runtime::http::router(readiness).merge(pipeline::audit::report::router(audit));
        tokio::spawn(async move { axum::serve(listener, app).await });
        RunningAudit {
            base: format!("http://{addr}"),
            stop,
            done: Some(done),
        }
    }
}

pub struct RunningAudit {
    pub base: String,
    stop: chatpipe_runtime::CancellationToken,
    done: Option<tokio::task::JoinHandle<anyhow::Result<()>>>,
}

impl RunningAudit {
    /// `GET /report`.
    pub async fn report(&self) -> Value {
        let res = reqwest::get(format!("{}/report", self.base))
            .await
            .expect("GET /report");
        assert_eq!(res.status(), 200, "GET /report");
        res.json().await.expect("a JSON report")
    }

    /// Polls `/report` until `done` holds; fails at the deadline with the last report.
    pub async fn until(
        &self,
        deadline: Duration,
        what: &str,
        done: impl Fn(&Value) -> bool,
    ) -> Value {
        let until = Instant::now() + deadline;
        loop {
            let report = self.report().await;
            if done(&report) {
                return report;
            }
            assert!(
                Instant::now() < until,
                "{what}: not within {deadline:?}; last report: {report:#}"
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// Waits until every alarm in `names` fires; returns how long that took.
    pub async fn firing(&self, names: &[&str], deadline: Duration) -> Duration {
        let started = Instant::now();
        self.until(deadline, &format!("alarms {names:?} firing"), |r| {
            names.iter().all(|n| is_firing(r, n))
        })
        .await;
        started.elapsed()
    }

    /// Stops it and waits for its tasks.
    pub async fn stop(mut self) -> anyhow::Result<()> {
        self.stop.cancel();
        self.done.take().expect("running").await?
    }
}

impl Drop for RunningAudit {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// Whether the report lists `name` as firing.
pub fn is_firing(report: &Value, name: &str) -> bool {
    report["firing"]
        .as_array()
        .is_some_and(|a| a.iter().any(|x| x["name"] == name))
}
