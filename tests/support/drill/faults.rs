//! The faults the drill injects, one after another, under load.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde::Serialize;

use super::services::{Services, FANOUT, GATEWAYS, INGEST, RECEIPTS};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Fault {
    /// SIGKILL one ingest-api; its service manager restarts it 5 s later.
    KillIngestApi,
    /// `pg_ctl restart -m fast`: every connection is cut.
    PostgresRestart,
    /// SIGSTOP the broker for `stall`, then SIGCONT.
    BrokerStall,
    /// A clean stop and start of the broker.
    BrokerRestart,
    /// SIGKILL the Connect worker, then start it again.
    KillConnect,
    /// The registry stopped for `registry_down`, then started.
    RegistryStop,
    KillReceipts,
    KillFanout,
    /// SIGKILL one gateway: its clients reconnect to the other and catch up over REST.
    KillGateway,
}

impl Fault {
    /// Every fault, in the order the full drill injects them.
    pub const ALL: [Fault; 9] = [
        Fault::KillIngestApi,
        Fault::PostgresRestart,
        Fault::BrokerStall,
        Fault::BrokerRestart,
        Fault::KillConnect,
        Fault::RegistryStop,
        Fault::KillReceipts,
        Fault::KillFanout,
        Fault::KillGateway,
    ];
    /// The short drill CI runs.
    pub const SHORT: [Fault; 3] = [Fault::KillIngestApi, Fault::KillConnect, Fault::KillGateway];

    pub fn name(self) -> &'static str {
        match self {
            Fault::KillIngestApi => "kill-ingest-api",
            Fault::PostgresRestart => "postgres-restart",
            Fault::BrokerStall => "broker-stall",
            Fault::BrokerRestart => "broker-restart",
            Fault::KillConnect => "kill-connect",
            Fault::RegistryStop => "registry-stop",
            Fault::KillReceipts => "kill-receipts",
            Fault::KillFanout => "kill-fanout",
            Fault::KillGateway => "kill-gateway",
        }
    }

    pub fn parse(name: &str) -> Option<Fault> {
        Fault::ALL.into_iter().find(|f| f.name() == name)
    }
}

/// How long the longer faults last.
#[derive(Debug, Clone, Copy)]
pub struct Durations {
    pub broker_stall: Duration,
    pub registry_down: Duration,
    /// A killed service of ours is started again this long after (a service manager's
    /// restart delay).
    pub restart_after: Duration,
}

/// `scripts/stack`, and the pids it keeps.
pub struct Stack {
    pub script: PathBuf,
    pub home: PathBuf,
}

impl Stack {
    pub async fn run(&self, args: &[&str]) {
        let status = tokio::process::Command::new(&self.script)
            .args(args)
            .status()
            .await
            .expect("scripts/stack runs");
        assert!(status.success(), "scripts/stack {args:?} failed");
    }

    fn pid(&self, component: &str) -> String {
        let file = self.home.join(format!("run/{component}.pid"));
        std::fs::read_to_string(&file)
            .unwrap_or_else(|e| panic!("{}: {e}", file.display()))
            .trim()
            .to_owned()
    }

    fn signal(&self, sig: &str, component: &str) {
        let status = std::process::Command::new("kill")
            .args([sig, &self.pid(component)])
            .status()
            .unwrap();
        assert!(status.success(), "kill {sig} {component}");
    }
}

/// Injects `fault` and returns when it ended (the moment recovery is timed from).
pub async fn inject(fault: Fault, services: &mut Services, stack: &Stack, d: Durations) -> Instant {
    match fault {
        Fault::KillIngestApi => restart(services, INGEST[0], d).await,
        Fault::KillReceipts => restart(services, RECEIPTS[0], d).await,
        Fault::KillFanout => restart(services, FANOUT[0], d).await,
        Fault::KillGateway => restart(services, GATEWAYS[0], d).await,
        Fault::PostgresRestart => {
            stack.run(&["restart", "postgres"]).await;
            Instant::now()
        }
        Fault::BrokerStall => {
            stack.signal("-STOP", "kafka");
            tokio::time::sleep(d.broker_stall).await;
            stack.signal("-CONT", "kafka");
            Instant::now()
        }
        Fault::BrokerRestart => {
            stack.run(&["restart", "kafka"]).await;
            Instant::now()
        }
        Fault::KillConnect => {
            stack.signal("-KILL", "connect");
            stack.run(&["start", "connect"]).await;
            Instant::now()
        }
        Fault::RegistryStop => {
            stack.run(&["down", "registry"]).await;
            tokio::time::sleep(d.registry_down).await;
            stack.run(&["start", "registry"]).await;
            Instant::now()
        }
    }
}

async fn restart(services: &mut Services, name: &str, d: Durations) -> Instant {
    services.kill(name).await;
    tokio::time::sleep(d.restart_after).await;
    services.start(name).await;
    Instant::now()
}
