//! The drill's services: two of each of ours, as processes on ports of their own, started,
//! killed and restarted the way a service manager would.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use tokio::process::{Child, Command};

/// Where the binaries are (debug in the test suite, release in `scripts/drill`).
#[derive(Debug, Clone)]
pub struct Bins {
    pub ingest_api: PathBuf,
    pub pipeline: PathBuf,
    pub gateway: PathBuf,
}

impl Bins {
    /// `<dir>/ingest-api`, `<dir>/pipeline`, `<dir>/gateway`.
    pub fn in_dir(dir: &std::path::Path) -> Self {
        Self {
            ingest_api: dir.join("ingest-api"),
            pipeline: dir.join("pipeline"),
            gateway: dir.join("gateway"),
        }
    }
}

/// What one service instance is.
#[derive(Debug, Clone)]
pub struct Spec {
    pub name: String,
    bin: PathBuf,
    args: Vec<String>,
    env: Vec<(String, String)>,
    /// Answers 200 once the service is up.
    pub health_url: String,
    /// Its `/readyz`, for the auditor's probes.
    pub ready_url: String,
    /// Its `/metrics` (on the admin listener where it has one).
    pub metrics_url: String,
}

/// The stack's addresses and the drill's secret, shared by every service.
#[derive(Debug, Clone)]
pub struct Env {
    pub database_url: String,
    pub brokers: String,
    pub registry_url: String,
    /// Kafka Connect's REST API: every worker, comma-separated.
    pub connect_url: String,
    /// The connector's replication slot (the cluster's connector has its own).
    pub slot: String,
    pub jwt_secret: String,
    pub logs: PathBuf,
    /// `scripts/stack`'s per-principal client configs (`KAFKA_CLIENT_CONFIGS`: the
    /// SASL_SSL listener, each service as its own principal). None on the clusters, which
    /// have no SASL listener: the services then use `brokers`.
    pub kafka_configs: Option<PathBuf>,
}

impl Env {
    fn common(&self) -> Vec<(String, String)> {
        // The services log in as chatpipe_service; the drill's own pool is the superuser's.
        let service_url = crate::as_service(&self.database_url);
        let mut env: Vec<(String, String)> = [
            ("DATABASE_URL", service_url.as_str()),
            ("SCHEMA_REGISTRY_URL", &self.registry_url),
            ("JWT_SECRET", &self.jwt_secret),
            ("RUST_LOG", "warn"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
        // With a principal's config its file names the brokers (the SASL listener).
        if self.kafka_configs.is_none() {
            env.push(("KAFKA_BROKERS".into(), self.brokers.clone()));
        }
        env
    }

    /// `--config <principal>.toml` where the services log in to Kafka as principals.
    fn login(&self, principal: &str) -> Vec<String> {
        match &self.kafka_configs {
            Some(dir) => vec![
                "--config".into(),
                dir.join(format!("{principal}.toml")).display().to_string(),
            ],
            None => vec![],
        }
    }
}

pub const INGEST: [&str; 2] = ["ingest-1", "ingest-2"];
pub const RECEIPTS: [&str; 2] = ["receipts-1", "receipts-2"];
pub const FANOUT: [&str; 2] = ["fanout-1", "fanout-2"];
pub const GATEWAYS: [&str; 2] = ["gateway-1", "gateway-2"];
pub const AUDIT: &str = "audit";

/// The drill's ports: ingest-api 818x (admin 828x), gateways 819x (admin 829x),
/// processors 91xx, the auditor 9133.
pub fn ingest_url(i: usize) -> String {
    format!("http://127.0.0.1:{}", 8181 + i)
}

pub fn gateway_url(i: usize) -> String {
    format!("ws://127.0.0.1:{}/ws", 8191 + i)
}

pub fn audit_url() -> String {
    "http://127.0.0.1:9133".into()
}

/// Every service of the drill: two ingest-api, two receipts processors, two fanout
/// processors, two gateways (chat.deliveries partitions 0 and 1), and the auditor.
pub fn specs(bins: &Bins, env: &Env) -> Vec<Spec> {
    let mut specs = Vec::new();
    for (i, name) in INGEST.iter().enumerate() {
        let base = ingest_url(i);
        let mut e = env.common();
        e.push((
            "INGEST_ADDR".into(),
            base.trim_start_matches("http://").into(),
        ));
        e.push((
            "INGEST_ADMIN_ADDR".into(),
            format!("127.0.0.1:{}", 8281 + i),
        ));
        specs.push(Spec {
            name: (*name).into(),
            bin: bins.ingest_api.clone(),
            args: env.login("ingest"),
            env: e,
            health_url: format!("{base}/readyz"),
            ready_url: format!("{base}/readyz"),
            metrics_url: format!("http://127.0.0.1:{}/metrics", 8281 + i),
        });
    }
    for (kind, names, first_port) in [("receipts", RECEIPTS, 9111), ("fanout", FANOUT, 9121)] {
        for (i, name) in names.iter().enumerate() {
            let addr = format!("127.0.0.1:{}", first_port + i);
            let mut e = env.common();
            e.push(("CHATPIPE_HTTP__METRICS_ADDR".into(), addr.clone()));
            specs.push(Spec {
                name: (*name).into(),
                bin: bins.pipeline.clone(),
                args: [env.login("pipeline"), vec![kind.into()]].concat(),
                env: e,
                health_url: format!("http://{addr}/healthz"),
                ready_url: format!("http://{addr}/readyz"),
                metrics_url: format!("http://{addr}/metrics"),
            });
        }
    }
    for (i, name) in GATEWAYS.iter().enumerate() {
        let addr = format!("127.0.0.1:{}", 8191 + i);
        let mut e = env.common();
        e.push(("GATEWAY_ADDR".into(), addr.clone()));
        e.push((
            "GATEWAY_ADMIN_ADDR".into(),
            format!("127.0.0.1:{}", 8291 + i),
        ));
        e.push(("GATEWAY_ID".into(), format!("drill-gw-{i}")));
        e.push(("CHATPIPE_DELIVERIES__PARTITION".into(), i.to_string()));
        specs.push(Spec {
            name: (*name).into(),
            bin: bins.gateway.clone(),
            args: env.login("gateway"),
            env: e,
            health_url: format!("http://{addr}/healthz"),
            ready_url: format!("http://{addr}/readyz"),
            metrics_url: format!("http://127.0.0.1:{}/metrics", 8291 + i),
        });
    }
    let probes: Vec<String> = specs
        .iter()
        .map(|s| format!("\"{}\"", s.ready_url))
        .collect();
    let mut e = env.common();
    e.push((
        "CHATPIPE_HTTP__METRICS_ADDR".into(),
        "127.0.0.1:9133".into(),
    ));
    e.push((
        "CHATPIPE_AUDIT__CONNECT_URL".into(),
        env.connect_url.clone(),
    ));
    e.push(("CHATPIPE_AUDIT__SLOT".into(), env.slot.clone()));
    e.push(("CHATPIPE_AUDIT__CHECK_INTERVAL_MS".into(), "1000".into()));
    // With a standby (scripts/stack up --ha), each server asked directly: the topology.
    let nodes: Vec<String> = std::env::var("CHATPIPE_PG_NODES")
        .unwrap_or_default()
        .split(',')
        .filter(|n| !n.is_empty())
        .map(|n| format!("\"{n}\""))
        .collect();
    e.push((
        "CHATPIPE_AUDIT__POSTGRES_NODES".into(),
        format!("[{}]", nodes.join(",")),
    ));
    e.push((
        "CHATPIPE_AUDIT__PROBES".into(),
        format!("[{}]", probes.join(",")),
    ));
    specs.push(Spec {
        name: AUDIT.into(),
        bin: bins.pipeline.clone(),
        args: [env.login("pipeline"), vec!["audit".into()]].concat(),
        env: e,
        health_url: format!("{}/healthz", audit_url()),
        ready_url: format!("{}/readyz", audit_url()),
        metrics_url: format!("{}/metrics", audit_url()),
    });
    specs
}

/// The running processes, by name.
pub struct Services {
    specs: BTreeMap<String, Spec>,
    running: BTreeMap<String, Child>,
    logs: PathBuf,
    http: reqwest::Client,
}

impl Services {
    pub fn new(specs: Vec<Spec>, logs: PathBuf) -> Self {
        std::fs::create_dir_all(&logs).expect("the drill's log directory");
        Self {
            specs: specs.into_iter().map(|s| (s.name.clone(), s)).collect(),
            running: BTreeMap::new(),
            logs,
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(2))
                .build()
                .unwrap(),
        }
    }

    pub fn names(&self) -> Vec<String> {
        self.specs.keys().cloned().collect()
    }

    pub fn spec(&self, name: &str) -> &Spec {
        &self.specs[name]
    }

    /// Starts `name` (its output appended to `<logs>/<name>.log`) and waits until it
    /// answers its health URL.
    pub async fn start(&mut self, name: &str) {
        let spec = self.specs[name].clone();
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.logs.join(format!("{name}.log")))
            .expect("a log file");
        let child = Command::new(&spec.bin)
            .args(&spec.args)
            // Only the brokers the drill names (its env, or the principal's --config
            // file), never the ones this process inherited.
            .env_remove("KAFKA_BROKERS")
            .envs(spec.env.iter().map(|(k, v)| (k, v)))
            .stdout(Stdio::from(log.try_clone().unwrap()))
            .stderr(Stdio::from(log))
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {name} ({}): {e}", spec.bin.display()));
        self.running.insert(name.to_owned(), child);
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Ok(r) = self.http.get(&spec.health_url).send().await {
                if r.status().is_success() {
                    return;
                }
            }
            let child = self.running.get_mut(name).unwrap();
            if let Ok(Some(status)) = child.try_wait() {
                panic!(
                    "{name} exited with {status} at start; see {}",
                    self.logs.join(format!("{name}.log")).display()
                );
            }
            assert!(
                Instant::now() < deadline,
                "{name} did not answer {} within 60 s",
                spec.health_url
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// SIGKILL, as a crash or the OOM killer would.
    /// What an operator's Prometheus would miss on each running service's `/metrics`: a
    /// metric family without `# HELP`, no `chatpipe_build_info`, or a counter an alert
    /// reads that no service exports (it must be there at 0 before anything counted it).
    /// Empty when nothing is.
    pub async fn metric_gaps(&self) -> Vec<String> {
        let mut gaps = Vec::new();
        let mut exported = std::collections::BTreeSet::new();
        for (name, spec) in &self.specs {
            if !self.running.contains_key(name) {
                continue;
            }
            let text = match reqwest::get(&spec.metrics_url).await {
                Ok(r) => r.text().await.unwrap_or_default(),
                Err(e) => {
                    gaps.push(format!("{name}: {} did not answer: {e}", spec.metrics_url));
                    continue;
                }
            };
            gaps.extend(
                crate::undescribed_metrics(&text)
                    .into_iter()
                    .map(|m| format!("{name}: {m}")),
            );
            exported.extend(text.lines().filter_map(|line| {
                line.strip_prefix("# TYPE ")
                    .and_then(|rest| rest.split_whitespace().next())
                    .map(str::to_owned)
            }));
        }
        gaps.extend(
            crate::counters_the_alerts_read()
                .difference(&exported)
                .map(|name| format!("an alert reads {name}, which no running service exports")),
        );
        gaps
    }

    pub async fn kill(&mut self, name: &str) {
        if let Some(mut child) = self.running.remove(name) {
            child.kill().await.expect("SIGKILL");
        }
    }

    /// Every service exited unexpectedly since it was started, with its status.
    pub fn exited(&mut self) -> Vec<(String, String)> {
        let mut out = Vec::new();
        for (name, child) in &mut self.running {
            if let Ok(Some(status)) = child.try_wait() {
                out.push((name.clone(), status.to_string()));
            }
        }
        out
    }

    /// SIGTERM to each, then waits for it (a clean stop).
    pub async fn stop_all(&mut self) {
        for (name, mut child) in std::mem::take(&mut self.running) {
            if let Some(pid) = child.id() {
                let _ = std::process::Command::new("kill")
                    .args(["-TERM", &pid.to_string()])
                    .status();
            }
            if tokio::time::timeout(Duration::from_secs(20), child.wait())
                .await
                .is_err()
            {
                eprintln!("{name} did not stop within 20 s of SIGTERM: killed");
                let _ = child.kill().await;
            }
        }
    }
}
