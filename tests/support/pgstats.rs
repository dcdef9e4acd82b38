//! What PostgreSQL itself counted during a benchmark phase: statements
//! (`pg_stat_statements`, by dbid), transactions (`pg_stat_database`) and rows
//! (`pg_stat_user_tables`), read before and after the phase and diffed. Benchmarks report
//! these instead of counting their own work.
//!
//! `pg_stat_statements` is updated as each statement ends. The other two are kept by each
//! backend and flushed to shared memory at most once a second while it works; a backend
//! that goes idle right after a flush holds its last counts for up to 10 s
//! (PostgreSQL 15's `PGSTAT_IDLE_INTERVAL`), and one that exits flushes them as it goes.
//! So a reading after a phase is exact only once the phase's connections have closed
//! ([`PgStats::wait_alone`]) or have been quiet for longer than that
//! ([`PgStats::read_settled`] with [`IDLE_FLUSH`]). Settling watches the row counters
//! only: read-only clients (the auditor polls every 5 s) commit transactions all the
//! time. Transactions are the database's, anyone's; a reading that never settled (some
//! other client kept writing) says so in `settled`.
//!
//! The reader's own queries in the benchmark's database are transactions there too: each
//! one forces its counts out at once and is counted, so that a [`Delta`] leaves them out.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use anyhow::Context;
use serde_json::json;
use sqlx::{Connection, PgConnection};

/// How long a quiet database must stay unchanged before a reading counts as final when
/// the phase's connections stay open in another process: longer than the 10 s an idle
/// PostgreSQL 15 backend may hold its last counts.
pub const IDLE_FLUSH: Duration = Duration::from_secs(11);

/// Where the benchmarks that load a running API find its database.
#[derive(clap::Args, Debug, Clone)]
pub struct PgArgs {
    /// Any database of the server (the stack's `DATABASE_URL`); statistics of the
    /// `--database` are read through it.
    #[arg(
        long,
        env = "DATABASE_URL",
        default_value = "postgres://postgres:postgres@127.0.0.1:5432/postgres"
    )]
    pub database_url: String,
    /// The database the loaded API writes (the stack's, which Debezium streams).
    #[arg(long, default_value = "chatpipe")]
    pub database: String,
    /// How long PostgreSQL's table and transaction counters must stay unchanged before a
    /// reading is final (see `pgstats::IDLE_FLUSH`).
    #[arg(long, default_value_t = IDLE_FLUSH.as_millis() as u64)]
    pub stats_quiet_ms: u64,
}

impl PgArgs {
    pub async fn connect(&self) -> anyhow::Result<PgStats> {
        PgStats::connect(&self.database_url, &self.database).await
    }

    pub fn quiet(&self) -> Duration {
        Duration::from_millis(self.stats_quiet_ms)
    }

    /// A reading once the loaded API's connections have been quiet long enough to have
    /// flushed their counts (they stay open: the API runs in another process).
    pub async fn settled(&self, stats: &mut PgStats) -> anyhow::Result<Snapshot> {
        stats.read_settled(self.quiet(), self.quiet() * 3).await
    }
}

/// Rows one table gained, changed and lost.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, sqlx::FromRow)]
pub struct TableRows {
    pub inserted: i64,
    pub updated: i64,
    pub deleted: i64,
}

/// One normalised statement of `pg_stat_statements`.
#[derive(Debug, Clone)]
pub struct Statement {
    /// Whitespace collapsed to single spaces, parameters as `$n`.
    pub query: String,
    pub calls: i64,
    pub rows: i64,
}

/// The counters at one moment.
#[derive(Debug, Clone)]
pub struct Snapshot {
    pub xact_commit: i64,
    pub xact_rollback: i64,
    /// Transactions the reader itself committed in the database up to this reading.
    own_commits: i64,
    /// False when the row counters were still moving when [`PgStats::read_settled`]
    /// gave up.
    pub settled: bool,
    tables: BTreeMap<String, TableRows>,
    statements: HashMap<i64, Statement>,
}

impl Snapshot {
    /// What happened between `before` and this reading, the reader's own queries left out.
    pub fn since(&self, before: &Snapshot) -> Delta {
        let tables = self
            .tables
            .iter()
            .map(|(name, after)| {
                let was = before.tables.get(name).copied().unwrap_or_default();
                let rows = TableRows {
                    inserted: after.inserted - was.inserted,
                    updated: after.updated - was.updated,
                    deleted: after.deleted - was.deleted,
                };
                (name.clone(), rows)
            })
            .collect();
        let mut statements: Vec<Statement> = self
            .statements
            .iter()
            .filter_map(|(id, after)| {
                let (calls, rows) = before
                    .statements
                    .get(id)
                    .map_or((0, 0), |b| (b.calls, b.rows));
                (after.calls > calls).then(|| Statement {
                    query: after.query.clone(),
                    calls: after.calls - calls,
                    rows: after.rows - rows,
                })
            })
            .filter(|s| !s.query.contains("pg_stat_"))
            .collect();
        statements.sort_by(|a, b| b.calls.cmp(&a.calls).then(a.query.cmp(&b.query)));
        Delta {
            settled: self.settled && before.settled,
            commits: (self.xact_commit - before.xact_commit)
                - (self.own_commits - before.own_commits),
            rollbacks: self.xact_rollback - before.xact_rollback,
            tables,
            statements,
        }
    }

    /// The row counters, which reach shared memory late; equal readings mean no rows
    /// moved.
    fn rows(&self) -> &BTreeMap<String, TableRows> {
        &self.tables
    }
}

/// What PostgreSQL counted in one phase.
#[derive(Debug, Clone)]
pub struct Delta {
    /// Both readings settled: no rows were still moving.
    pub settled: bool,
    /// Committed transactions (`pg_stat_database.xact_commit`).
    pub commits: i64,
    pub rollbacks: i64,
    tables: BTreeMap<String, TableRows>,
    /// Statements executed in the phase, most called first.
    pub statements: Vec<Statement>,
}

impl Delta {
    /// Calls of the statements whose text starts with `prefix` (e.g.
    /// `"UPDATE conversation_member"`), whitespace collapsed.
    pub fn calls(&self, prefix: &str) -> i64 {
        self.matching(prefix).map(|s| s.calls).sum()
    }

    /// Rows those statements returned or changed.
    pub fn rows(&self, prefix: &str) -> i64 {
        self.matching(prefix).map(|s| s.rows).sum()
    }

    fn matching<'a>(&'a self, prefix: &'a str) -> impl Iterator<Item = &'a Statement> + 'a {
        self.statements
            .iter()
            .filter(move |s| s.query.starts_with(prefix))
    }

    /// Rows `table` gained, changed and lost (`pg_stat_user_tables`).
    pub fn table(&self, table: &str) -> TableRows {
        self.tables.get(table).copied().unwrap_or_default()
    }

    /// A note for printed figures when a reading never settled.
    pub fn caveat(&self) -> &'static str {
        if self.settled {
            ""
        } else {
            " [not settled: includes another client's writes]"
        }
    }

    /// All statement calls of the phase.
    pub fn statement_calls(&self) -> i64 {
        self.statements.iter().map(|s| s.calls).sum()
    }

    pub fn json(&self) -> serde_json::Value {
        let tables: serde_json::Map<String, serde_json::Value> = self
            .tables
            .iter()
            .filter(|(_, r)| **r != TableRows::default())
            .map(|(name, r)| {
                (
                    name.clone(),
                    json!({"inserted": r.inserted, "updated": r.updated, "deleted": r.deleted}),
                )
            })
            .collect();
        let statements: Vec<_> = self
            .statements
            .iter()
            .take(20)
            .map(|s| {
                let query: String = s.query.chars().take(160).collect();
                json!({"calls": s.calls, "rows": s.rows, "query": query})
            })
            .collect();
        json!({
            "source": "pg_stat_statements, pg_stat_database, pg_stat_user_tables",
            "settled": self.settled,
            "transactions_committed": self.commits,
            "transactions_rolled_back": self.rollbacks,
            "statements": self.statement_calls(),
            "tables": tables,
            "top_statements": statements,
        })
    }
}

/// A reader of one database's statistics.
pub struct PgStats {
    /// The server's database of `database_url`: pg_stat_statements (its extension lives
    /// there) and pg_stat_database, read without adding to the benchmark database's counts.
    server: PgConnection,
    /// The benchmark's database: pg_stat_user_tables exists only per database.
    target: PgConnection,
    target_pid: i32,
    db: String,
    dbid: i64,
    own_commits: i64,
}

impl PgStats {
    /// Connects to `db` on the server of `server_url`.
    pub async fn connect(server_url: &str, db: &str) -> anyhow::Result<Self> {
        let mut server = PgConnection::connect(server_url)
            .await
            .context("connecting to PostgreSQL for its statistics")?;
        sqlx::query("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            .execute(&mut server)
            .await
            .context("pg_stat_statements (the server must preload it: scripts/stack does)")?;
        let dbid: i64 =
            sqlx::query_scalar("SELECT oid::bigint FROM pg_database WHERE datname = $1")
                .bind(db)
                .fetch_optional(&mut server)
                .await?
                .with_context(|| format!("no database {db}"))?;
        let mut target = PgConnection::connect(&crate::with_database(server_url, db))
            .await
            .with_context(|| format!("connecting to {db}"))?;
        let target_pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
            .fetch_one(&mut target)
            .await?;
        Ok(Self {
            server,
            target,
            target_pid,
            db: db.to_owned(),
            dbid,
            // The pid query above; its count is forced out by the first reading.
            own_commits: 1,
        })
    }

    /// One reading, as the counters stand in shared memory now.
    pub async fn read(&mut self) -> anyhow::Result<Snapshot> {
        // Forces this transaction's own counts out when it ends, so the reading of
        // pg_stat_database below already holds it.
        // A partitioned table's rows are counted on its partitions: summed under its name.
        let tables: Vec<(String, i64, i64, i64)> = sqlx::query_as(
            "SELECT coalesce(p.relname, s.relname)::text, sum(s.n_tup_ins)::bigint,
                    sum(s.n_tup_upd)::bigint, sum(s.n_tup_del)::bigint
               FROM pg_stat_user_tables s
               LEFT JOIN pg_inherits i ON i.inhrelid = s.relid
               LEFT JOIN pg_class p ON p.oid = i.inhparent AND p.relkind = 'p'
              CROSS JOIN pg_stat_force_next_flush()
              GROUP BY 1",
        )
        .fetch_all(&mut self.target)
        .await?;
        self.own_commits += 1;
        let (xact_commit, xact_rollback): (i64, i64) = sqlx::query_as(
            "SELECT xact_commit, xact_rollback FROM pg_stat_database WHERE datname = $1",
        )
        .bind(&self.db)
        .fetch_one(&mut self.server)
        .await?;
        let statements: Vec<(i64, String, i64, i64)> = sqlx::query_as(
            "SELECT queryid, query, calls, rows FROM pg_stat_statements
              WHERE dbid = $1::oid AND toplevel AND queryid IS NOT NULL",
        )
        .bind(self.dbid)
        .fetch_all(&mut self.server)
        .await?;
        Ok(Snapshot {
            xact_commit,
            xact_rollback,
            own_commits: self.own_commits,
            settled: true,
            tables: tables
                .into_iter()
                .map(|(name, inserted, updated, deleted)| {
                    let rows = TableRows {
                        inserted,
                        updated,
                        deleted,
                    };
                    (name, rows)
                })
                .collect(),
            statements: statements
                .into_iter()
                .map(|(id, query, calls, rows)| {
                    let query = query.split_whitespace().collect::<Vec<_>>().join(" ");
                    (id, Statement { query, calls, rows })
                })
                .collect(),
        })
    }

    /// Reads until the row counters have not moved for `quiet`. After `limit` it gives
    /// up (another client keeps writing) and returns the last reading, marked unsettled.
    pub async fn read_settled(
        &mut self,
        quiet: Duration,
        limit: Duration,
    ) -> anyhow::Result<Snapshot> {
        let deadline = Instant::now() + limit;
        let mut last = self.read().await?;
        let mut unchanged_since = Instant::now();
        loop {
            tokio::time::sleep(Duration::from_millis(200)).await;
            let mut now = self.read().await?;
            if now.rows() != last.rows() {
                unchanged_since = Instant::now();
            } else if unchanged_since.elapsed() >= quiet {
                return Ok(now);
            }
            if Instant::now() >= deadline {
                eprintln!(
                    "{}: rows still moving after {limit:?}; these counts include another client's",
                    self.db
                );
                now.settled = false;
                return Ok(now);
            }
            last = now;
        }
    }

    /// Waits until no client but this reader is connected to the database: every
    /// connection of the phase has closed, and so flushed its counts.
    pub async fn wait_alone(&mut self, limit: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + limit;
        loop {
            let others: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM pg_stat_activity
                  WHERE datname = $1 AND pid <> $2 AND backend_type = 'client backend'",
            )
            .bind(&self.db)
            .bind(self.target_pid)
            .fetch_one(&mut self.server)
            .await?;
            if others == 0 {
                return Ok(());
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "{others} connections to {} still open after {limit:?}",
                self.db
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// [`wait_for_autovacuum`] on this reader's server connection.
    pub async fn wait_for_autovacuum(&mut self, limit: Duration) -> anyhow::Result<Duration> {
        wait_for_autovacuum(&mut self.server, limit).await
    }

    /// Runs the benchmark's own `SELECT <scalar>` in the database, as a transaction the
    /// deltas leave out.
    pub async fn scalar(&mut self, select: &str) -> anyhow::Result<i64> {
        let value: i64 = sqlx::query_scalar(&format!(
            "SELECT ({select})::bigint FROM pg_stat_force_next_flush()"
        ))
        .fetch_one(&mut self.target)
        .await
        .with_context(|| select.to_owned())?;
        self.own_commits += 1;
        Ok(value)
    }
}

/// Waits (up to `limit`) until no autovacuum worker runs anywhere on the server, so
/// that a measurement does not share the machine with one; returns how long it waited.
pub async fn wait_for_autovacuum(
    server: &mut PgConnection,
    limit: Duration,
) -> anyhow::Result<Duration> {
    let started = Instant::now();
    loop {
        let workers: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'autovacuum worker'",
        )
        .fetch_one(&mut *server)
        .await?;
        if workers == 0 {
            return Ok(started.elapsed());
        }
        if started.elapsed() >= limit {
            eprintln!(
                "{workers} autovacuum workers still running after {limit:?}; measuring anyway"
            );
            return Ok(started.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}
