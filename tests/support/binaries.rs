//! The services' binaries, started as a deployment starts them (configured through the
//! environment): for what only a process of its own shows (a SIGKILL, the spans a
//! process exports under its own `service.name`). `scripts/test` builds them and names
//! them in `CHATPIPE_INGEST_API_BIN`, `CHATPIPE_PIPELINE_BIN` and `CHATPIPE_GATEWAY_BIN`.

use std::process::Stdio;
use std::time::Duration;

use crate::stream::{brokers, Pipeline};
use crate::{as_service, registry_url, JWT_SECRET};

fn binary(var: &str, package: &str) -> String {
    std::env::var(var).unwrap_or_else(|_| {
        panic!(
            "{var} is not set: build it (`cargo build -p {package}`) and point it at \
             target/debug/{package}, as scripts/test does"
        )
    })
}

/// A port free now, for a binary to bind.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .unwrap()
        .port()
}

/// The gateway binary with `s`'s identity, topics and leases, listening on `addr`.
pub fn gateway_command(s: &gateway::Settings, addr: &str) -> std::process::Command {
    let mut cmd = std::process::Command::new(binary("CHATPIPE_GATEWAY_BIN", "gateway"));
    cmd.env("GATEWAY_ADDR", addr)
        .env("GATEWAY_ADMIN_ADDR", "127.0.0.1:0")
        .env("GATEWAY_ID", &s.gateway.id)
        .env("JWT_SECRET", JWT_SECRET)
        .env("KAFKA_BROKERS", brokers())
        .env("SCHEMA_REGISTRY_URL", registry_url())
        .env("CHATPIPE_PRESENCE__TOPIC", &s.presence.topic)
        .env(
            "CHATPIPE_PRESENCE__LEASE_MS",
            s.presence.lease_ms.to_string(),
        )
        .env(
            "CHATPIPE_PRESENCE__RENEW_MS",
            s.presence.renew_ms.to_string(),
        )
        .env("CHATPIPE_DELIVERIES__TOPIC", &s.deliveries.topic)
        .env(
            "CHATPIPE_DELIVERIES__PARTITION",
            s.deliveries.partition.to_string(),
        )
        .env("CHATPIPE_SIGNALS__ACKS_TOPIC", &s.signals.acks_topic)
        .env(
            "CHATPIPE_SIGNALS__EPHEMERAL_TOPIC",
            &s.signals.ephemeral_topic,
        )
        .stdout(Stdio::null())
        .stderr(Stdio::inherit());
    cmd
}

/// `pipeline fanout` on `p`'s topics ([`Pipeline::fanout_settings`]).
pub fn fanout_command(p: &Pipeline) -> tokio::process::Command {
    let s = p.fanout_settings();
    let f = &s.fanout;
    let mut cmd = tokio::process::Command::new(binary("CHATPIPE_PIPELINE_BIN", "pipeline"));
    cmd.arg("fanout")
        .env("KAFKA_BROKERS", brokers())
        .env("SCHEMA_REGISTRY_URL", registry_url())
        .env("DATABASE_URL", as_service(&p.database_url))
        .env("CHATPIPE_REGISTRY__EVENTS_SUBJECT", &p.events_subject)
        .env("CHATPIPE_FANOUT__EVENTS_TOPIC", &f.events_topic)
        .env("CHATPIPE_FANOUT__GROUP", &f.group)
        .env("CHATPIPE_FANOUT__PRESENCE_TOPIC", &f.presence_topic)
        .env("CHATPIPE_FANOUT__DELIVERIES_TOPIC", &f.deliveries_topic)
        .env("CHATPIPE_FANOUT__CHANGELOG_TOPIC", &f.changelog_topic)
        .env("CHATPIPE_FANOUT__EPHEMERAL_TOPIC", &f.ephemeral_topic)
        .env("CHATPIPE_FANOUT__TYPING_GROUP", &f.typing_group)
        .env("CHATPIPE_HTTP__METRICS_ADDR", "127.0.0.1:0")
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .kill_on_drop(true);
    cmd
}

/// An ingest-api process.
pub struct IngestApi {
    pub child: tokio::process::Child,
    /// `http://127.0.0.1:<port>`.
    pub base: String,
}

/// The ingest-api binary on `database_url` (a superuser's URL of a migrated database: it
/// connects as the services do), writing events of `events_subject`, with `env` on top;
/// returned once `/readyz` answers.
pub async fn spawn_ingest_api(
    database_url: &str,
    events_subject: &str,
    env: &[(&str, &str)],
) -> IngestApi {
    let (port, admin) = (free_port(), free_port());
    let mut cmd = tokio::process::Command::new(binary("CHATPIPE_INGEST_API_BIN", "ingest-api"));
    cmd.env("DATABASE_URL", as_service(database_url))
        .env("CHATPIPE_DATABASE__MIGRATE_ON_START", "false")
        .env("JWT_SECRET", JWT_SECRET)
        .env("SCHEMA_REGISTRY_URL", registry_url())
        .env("CHATPIPE_REGISTRY__EVENTS_SUBJECT", events_subject)
        .env("KAFKA_BROKERS", brokers())
        .env("INGEST_ADDR", format!("127.0.0.1:{port}"))
        .env("INGEST_ADMIN_ADDR", format!("127.0.0.1:{admin}"))
        .env("RUST_LOG", "info")
        .kill_on_drop(true);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().expect("ingest-api starts");
    let base = format!("http://127.0.0.1:{port}");
    let http = reqwest::Client::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while !http
        .get(format!("{base}/readyz"))
        .send()
        .await
        .is_ok_and(|r| r.status().is_success())
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "ingest-api not ready on {base} after 60 s"
        );
        assert!(child.try_wait().unwrap().is_none(), "ingest-api exited");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    IngestApi { child, base }
}

/// A process killed (SIGKILL) and reaped when the test ends, passed or failed.
pub struct KillOnDrop(pub std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
