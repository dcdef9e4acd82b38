//! `drill`: the full fault drill (`scripts/drill` builds the services and runs this).
//! Two of every service of ours, load for the whole drill, every fault in turn, and the
//! audit of what was lost after each; a table on stderr, JSON in `--out`, and a non-zero
//! exit when anything was lost, a gateway with connected clients pushed less than 90% of
//! its members' messages after the recovery time, or a service was still not ready at
//! the end of a row's settle time.

use std::path::PathBuf;
use std::time::Duration;

use chatpipe_tests::drill::faults::{Durations, Fault};
use chatpipe_tests::drill::services::Bins;
use chatpipe_tests::drill::{run, Config};
use clap::Parser;

#[derive(Parser, Debug)]
#[command(about = "chatpipe's fault drill")]
struct Args {
    /// Faults, in order (default: all of the single node's, or with --cluster all of the
    /// cluster's). The single node's: kill-ingest-api, postgres-restart, broker-stall,
    /// broker-restart, kill-connect, registry-stop, kill-receipts, kill-fanout,
    /// kill-gateway. The cluster's: kill-leader, kill-controller, rolling-restart,
    /// stall-node, stall-coordinator, kill-worker, restart-workers. PostgreSQL's with a
    /// standby: pg-failover, pg-switchover, pg-standby-killed, pg-stall.
    #[arg(long, value_delimiter = ',')]
    faults: Vec<String>,
    /// The faults of the Kafka and Connect clusters (scripts/drill --cluster points the
    /// services at them).
    #[arg(long)]
    cluster: bool,
    /// The faults of PostgreSQL with a synchronous standby (scripts/drill --ha runs
    /// scripts/stack up --ha first): pg-failover, pg-switchover, pg-standby-killed,
    /// pg-stall.
    #[arg(long)]
    ha: bool,
    /// How long pg-stall stops the primary.
    #[arg(long, default_value_t = 30)]
    pg_stall_secs: u64,
    /// How long commits wait for a killed standby before synchronous replication is
    /// switched off (the orchestrator's decision).
    #[arg(long, default_value_t = 10)]
    standby_grace_secs: u64,
    /// Seconds of load after each fault before it is audited.
    #[arg(long, default_value_t = 60)]
    settle_secs: u64,
    /// Seconds after a fault ends before each gateway must push 90% again.
    #[arg(long, default_value_t = 30)]
    push_recovery_secs: u64,
    /// WebSocket clients (one user each).
    #[arg(long, default_value_t = 1000)]
    clients: usize,
    #[arg(long, default_value_t = 200)]
    conversations: usize,
    /// Messages a second, through both ingest-apis.
    #[arg(long, default_value_t = 100)]
    send_rate: u32,
    #[arg(long, default_value_t = 20)]
    read_rate: u32,
    #[arg(long, default_value_t = 90)]
    broker_stall_secs: u64,
    #[arg(long, default_value_t = 60)]
    registry_down_secs: u64,
    /// How long a killed cluster node stays down.
    #[arg(long, default_value_t = 30)]
    node_down_secs: u64,
    /// Where ingest-api, pipeline and gateway are.
    #[arg(long, default_value = "target/release")]
    bins: PathBuf,
    #[arg(long, default_value = "target/drill")]
    out: PathBuf,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let faults = if args.faults.is_empty() && args.ha {
        Fault::HA.to_vec()
    } else if args.faults.is_empty() && args.cluster {
        Fault::CLUSTER.to_vec()
    } else if args.faults.is_empty() {
        Fault::ALL.to_vec()
    } else {
        args.faults
            .iter()
            .map(|f| Fault::parse(f).ok_or_else(|| anyhow::anyhow!("unknown fault {f:?}")))
            .collect::<anyhow::Result<_>>()?
    };
    let repo = std::env::current_dir()?;
    let rows = run(Config {
        faults,
        settle: Duration::from_secs(args.settle_secs),
        push_recovery: Duration::from_secs(args.push_recovery_secs),
        users: args.clients,
        conversations: args.conversations,
        send_rate: args.send_rate,
        read_rate: args.read_rate,
        durations: Durations {
            broker_stall: Duration::from_secs(args.broker_stall_secs),
            registry_down: Duration::from_secs(args.registry_down_secs),
            restart_after: Duration::from_secs(5),
            node_down: Duration::from_secs(args.node_down_secs),
            pg_stall: Duration::from_secs(args.pg_stall_secs),
            standby_grace: Duration::from_secs(args.standby_grace_secs),
        },
        bins: Bins::in_dir(&args.bins),
        out: args.out,
        repo,
    })
    .await;
    let failed: Vec<String> = rows
        .iter()
        .filter(|r| !r.failures().is_empty())
        .map(|r| format!("{}: {}", r.fault, r.failures().join("; ")))
        .collect();
    if !failed.is_empty() {
        anyhow::bail!("the drill failed (see the table): {}", failed.join(" | "));
    }
    Ok(())
}
