//! The database's own limit for a send, measured in the same run as the API: the
//! design's send SQL (`tests/bench/pgbench/`) run raw by `pgbench` on a scratch database
//! of the same server. Benchmarks print their figures as ratios of these.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context};
use sqlx::{Connection, Executor, PgConnection};

use crate::cpu::CpuSample;

const SCHEMA: &str = include_str!("../bench/pgbench/schema.sql");
const SEED: &str = include_str!("../bench/pgbench/seed.sql");
const ONE_STATEMENT: &str = include_str!("../bench/pgbench/cte.sql");
const DATABASE: &str = "chatpipe_pgbench";

/// Which form of the send transaction.
#[derive(Clone, Copy, Debug)]
pub enum Script {
    /// The original design's send (`seed.sql`), statement by statement in one transaction.
    Seed,
    /// The same work as one statement.
    OneStatement,
}

pub struct Pgbench {
    url: String,
    dir: PathBuf,
    clients: usize,
    /// The server's `postgres` database, to see what else the server does.
    server: PgConnection,
}

/// One script's figure and what competed with it: a baseline is the database's own
/// limit only if nothing else ran, so each run says what did.
#[derive(Debug, Clone)]
pub struct Measured {
    pub tps: f64,
    /// Cores each other piece of the machine used while pgbench ran (pgbench and its
    /// connections start and end within the run, so they are not counted).
    pub cpu: BTreeMap<&'static str, f64>,
    /// Checkpoints the server started meanwhile (timed or requested).
    pub checkpoints: i64,
    /// How long the run waited, before it started, for autovacuum workers to finish.
    pub waited_for_autovacuum: Duration,
}

impl Measured {
    pub fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "tps": self.tps,
            "cpu_cores": self.cpu,
            "checkpoints": self.checkpoints,
            "waited_for_autovacuum_s": self.waited_for_autovacuum.as_secs_f64(),
        })
    }
}

/// Checkpoints started since the server's statistics were reset (PostgreSQL 17 moved
/// them from `pg_stat_bgwriter` to `pg_stat_checkpointer`).
async fn checkpoints(server: &mut PgConnection) -> anyhow::Result<i64> {
    let v17: Option<String> =
        sqlx::query_scalar("SELECT to_regclass('pg_catalog.pg_stat_checkpointer')::text")
            .fetch_one(&mut *server)
            .await?;
    let sql = if v17.is_some() {
        "SELECT num_timed + num_requested FROM pg_stat_checkpointer"
    } else {
        "SELECT checkpoints_timed + checkpoints_req FROM pg_stat_bgwriter"
    };
    Ok(sqlx::query_scalar(sql).fetch_one(&mut *server).await?)
}

impl Pgbench {
    /// A fresh scratch database on the server of `server_url` with the scripts' tables,
    /// and the scripts written under `dir`. Fails if `pgbench` is not installed.
    pub async fn prepare(server_url: &str, dir: &str, clients: usize) -> anyhow::Result<Self> {
        let version = tokio::process::Command::new("pgbench")
            .arg("--version")
            .output()
            .await
            .context(
                "running pgbench (PostgreSQL's client tools; scripts/stack up installs them)",
            )?;
        anyhow::ensure!(version.status.success(), "pgbench --version failed");
        let mut admin = sqlx::PgConnection::connect(server_url).await?;
        admin
            .execute(format!("DROP DATABASE IF EXISTS {DATABASE} WITH (FORCE)").as_str())
            .await?;
        admin
            .execute(format!("CREATE DATABASE {DATABASE}").as_str())
            .await?;
        // Kept: the server's activity and checkpoints are read through it.
        let server = admin;
        let url = crate::with_database(server_url, DATABASE);
        let mut db = sqlx::PgConnection::connect(&url).await?;
        sqlx::raw_sql(SCHEMA)
            .execute(&mut db)
            .await
            .context("creating the pgbench tables")?;
        db.close().await?;
        let dir = PathBuf::from(dir);
        std::fs::create_dir_all(&dir)?;
        std::fs::write(dir.join("seed.sql"), SEED)?;
        std::fs::write(dir.join("cte.sql"), ONE_STATEMENT)?;
        Ok(Self {
            url,
            dir,
            clients,
            server,
        })
    }

    /// Transactions per second of `script` over `conversations` conversations (1: all
    /// into one) for `duration`, once no autovacuum worker runs, with what the machine
    /// did meanwhile.
    pub async fn run(
        &mut self,
        script: Script,
        conversations: u32,
        duration: Duration,
    ) -> anyhow::Result<Measured> {
        let waited_for_autovacuum =
            crate::pgstats::wait_for_autovacuum(&mut self.server, Duration::from_secs(120)).await?;
        let checkpoints_before = checkpoints(&mut self.server).await?;
        let cpu_before = CpuSample::now();
        let tps = self.tps(script, conversations, duration).await?;
        Ok(Measured {
            tps,
            cpu: CpuSample::now().cores_since(&cpu_before),
            checkpoints: checkpoints(&mut self.server).await? - checkpoints_before,
            waited_for_autovacuum,
        })
    }

    async fn tps(
        &self,
        script: Script,
        conversations: u32,
        duration: Duration,
    ) -> anyhow::Result<f64> {
        let file = self.dir.join(match script {
            Script::Seed => "seed.sql",
            Script::OneStatement => "cte.sql",
        });
        let out = tokio::process::Command::new("pgbench")
            .args(["-n", "-M", "prepared", "-j", "2"])
            .args(["-c", &self.clients.to_string()])
            .args(["-T", &duration.as_secs().max(1).to_string()])
            .args(["-D", &format!("nconv={conversations}")])
            .arg("-f")
            .arg(&file)
            .arg(&self.url)
            .output()
            .await
            .context("running pgbench")?;
        let text = String::from_utf8_lossy(&out.stdout);
        if !out.status.success() {
            bail!(
                "pgbench {script:?} failed ({}): {}{}",
                out.status,
                text,
                String::from_utf8_lossy(&out.stderr)
            );
        }
        parse_tps(&text).with_context(|| format!("no tps in pgbench's output: {text}"))
    }

    pub fn clients(&self) -> usize {
        self.clients
    }
}

/// `tps = 1234.56 (without initial connection time)` → 1234.56.
fn parse_tps(text: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix("tps = "))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
}

#[cfg(test)]
mod tests {
    #[test]
    fn reads_the_tps_line() {
        let out = "number of transactions actually processed: 9611\n\
                   latency average = 16.651 ms\n\
                   initial connection time = 21.862 ms\n\
                   tps = 960.907315 (without initial connection time)\n";
        assert_eq!(super::parse_tps(out), Some(960.907315));
        assert_eq!(super::parse_tps("pgbench: error"), None);
    }
}
