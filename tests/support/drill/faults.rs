//! The faults the drill injects, one after another, under load.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde::Serialize;

use super::services::{Services, FANOUT, GATEWAYS, INGEST, RECEIPTS};
use crate::cluster;

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
    // On the cluster (`scripts/drill --cluster`): each is ridden out while it lasts.
    /// SIGKILL the node that leads chat.events partition 0; started again after
    /// `node_down`, then waited back into every ISR.
    KillLeader,
    /// SIGKILL the active KRaft controller (in combined mode also a broker), likewise. A
    /// row of its own: killing it together with the leader of a different node would take
    /// two of three voters, the quorum, and every partition's second in-sync replica.
    KillController,
    /// Each node restarted cleanly in turn, the next only once the last is back in every
    /// ISR: the rolling restart of an upgrade.
    RollingRestart,
    /// SIGSTOP the node that leads chat.events partition 0 for `broker_stall`, then
    /// SIGCONT; waited back into every ISR.
    StallNode,
    /// SIGSTOP the node that coordinates the Connect workers' group for `broker_stall`:
    /// the worker running the task cannot reach its coordinator and revokes the task.
    StallCoordinator,
    /// SIGKILL the Connect worker that runs the connector's task; started again once the
    /// task runs on the other worker.
    KillWorker,
    /// Both Connect workers restarted one after the other, each once the task runs again.
    RestartWorkers,
    // With a synchronous standby (`scripts/drill --ha`): recovery timed from the start.
    /// SIGKILL of the primary; the standby promoted; the old primary seeded anew as its
    /// standby (`scripts/stack failover`).
    PgFailover,
    /// The primary stopped cleanly, the standby promoted, the old primary following it.
    PgSwitchover,
    /// SIGKILL of the standby: every commit waits for it (synchronous_standby_names).
    /// After `standby_grace` the orchestrator's decision, `scripts/stack synchronous off`
    /// (commits go on, on one server), then the standby is brought back and synchronous
    /// again (`scripts/stack rejoin`).
    PgStandbyKilled,
    /// SIGSTOP of the primary's processes for `pg_stall`, then SIGCONT; no promotion.
    PgStall,
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
    /// Every fault of the cluster drill, in order.
    pub const CLUSTER: [Fault; 7] = [
        Fault::KillLeader,
        Fault::KillController,
        Fault::RollingRestart,
        Fault::StallNode,
        Fault::StallCoordinator,
        Fault::KillWorker,
        Fault::RestartWorkers,
    ];
    /// Every fault of PostgreSQL with a synchronous standby, in order.
    pub const HA: [Fault; 4] = [
        Fault::PgFailover,
        Fault::PgSwitchover,
        Fault::PgStandbyKilled,
        Fault::PgStall,
    ];

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
            Fault::KillLeader => "kill-leader",
            Fault::KillController => "kill-controller",
            Fault::RollingRestart => "rolling-restart",
            Fault::StallNode => "stall-node",
            Fault::StallCoordinator => "stall-coordinator",
            Fault::KillWorker => "kill-worker",
            Fault::RestartWorkers => "restart-workers",
            Fault::PgFailover => "pg-failover",
            Fault::PgSwitchover => "pg-switchover",
            Fault::PgStandbyKilled => "pg-standby-killed",
            Fault::PgStall => "pg-stall",
        }
    }

    pub fn parse(name: &str) -> Option<Fault> {
        Fault::ALL
            .into_iter()
            .chain(Fault::CLUSTER)
            .chain(Fault::HA)
            .find(|f| f.name() == name)
    }

    /// A fault of the cluster drill: the system must keep going while it lasts, so
    /// recovery is timed from its start (on the single node, from its end).
    pub fn on_cluster(self) -> bool {
        Fault::CLUSTER.contains(&self)
    }

    /// A fault of PostgreSQL with a standby (`scripts/stack up --ha`).
    pub fn on_ha(self) -> bool {
        Fault::HA.contains(&self)
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
    /// How long a killed cluster node stays down (the cluster runs on two meanwhile).
    pub node_down: Duration,
    /// How long PostgreSQL's primary is stopped (SIGSTOP).
    pub pg_stall: Duration,
    /// How long commits wait for a killed standby before synchronous replication is
    /// switched off (Patroni's synchronous_mode decides within a loop, ~10 s).
    pub standby_grace: Duration,
}

/// What the cluster faults need to know: the brokers, the connector, and the topics whose
/// replicas must be back in sync before a fault ends.
#[derive(Debug, Clone)]
pub struct Cluster {
    pub brokers: String,
    pub connector: String,
    /// The Connect workers' group (`group.id` of config/stack/cluster/).
    pub connect_group: String,
    pub nodes: usize,
    pub workers: usize,
}

/// Every replicated topic of the stack, Connect's and Kafka's own included: a node is back
/// when it is in the ISR of all of them.
pub const SYNCED_TOPICS: [&str; 11] = [
    "chat.events",
    "chat.read-receipts",
    "chat.delivery-acks",
    "chat.ephemeral",
    "chat.presence",
    "chat.fanout-members",
    "chat.deliveries",
    "_connect-configs",
    "_connect-offsets",
    "_connect-status",
    "__consumer_offsets",
];

/// How long a node may take to be back in every ISR, and the task to run again.
const BACK_WITHIN: Duration = Duration::from_secs(120);

/// A fault as it happened: when, and what it hit.
#[derive(Debug, Clone)]
pub struct Injected {
    /// The moment recovery is timed from: the fault's end on the single node, its start
    /// on the cluster ([`Fault::on_cluster`]).
    pub from: Instant,
    /// What was hit, in words (`kafka-2, leader of chat.events/0`), for the table.
    pub what: String,
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

    pub fn signal(&self, sig: &str, component: &str) {
        let status = std::process::Command::new("kill")
            .args([sig, &self.pid(component)])
            .status()
            .unwrap();
        assert!(status.success(), "kill {sig} {component}");
    }
}

/// Injects `fault` and returns once it is over (the cluster's nodes back in sync).
pub async fn inject(
    fault: Fault,
    services: &mut Services,
    stack: &Stack,
    cluster: &Cluster,
    d: Durations,
) -> Injected {
    if fault.on_cluster() {
        return inject_on_cluster(fault, stack, cluster, d).await;
    }
    if fault.on_ha() {
        return inject_on_ha(fault, stack, d).await;
    }
    let ended = match fault {
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
        cluster_fault => unreachable!("{cluster_fault:?} is injected on the cluster"),
    };
    Injected {
        from: ended,
        what: String::new(),
    }
}

/// The node a node fault hits, and its role in words: the leader of chat.events/0, the
/// active controller, or the Connect group's coordinator.
async fn target(fault: Fault, c: &Cluster) -> (i32, String) {
    if fault == Fault::KillController {
        return (
            cluster::active_controller().await,
            "active controller".into(),
        );
    }
    let (b, group) = (c.brokers.clone(), c.connect_group.clone());
    tokio::task::spawn_blocking(move || {
        if fault == Fault::StallCoordinator {
            let id = cluster::group_coordinator(&b, &group);
            (id, format!("coordinator of {group}"))
        } else {
            let id = cluster::leader_and_isr(&b, "chat.events", 0).0;
            (id, "leader of chat.events/0".to_owned())
        }
    })
    .await
    .expect("metadata task")
}

async fn inject_on_cluster(fault: Fault, stack: &Stack, c: &Cluster, d: Durations) -> Injected {
    let started = Instant::now();
    let what = match fault {
        Fault::KillLeader | Fault::KillController => {
            let (id, role) = target(fault, c).await;
            let node = cluster::node_component(id);
            let started = Instant::now();
            stack.signal("-KILL", &node);
            tokio::time::sleep(d.node_down).await;
            stack.run(&["start", &node]).await;
            let synced = cluster::wait_in_sync(&c.brokers, &SYNCED_TOPICS, BACK_WITHIN).await;
            return Injected {
                from: started,
                what: format!(
                    "{node} ({role}) down {} s, in sync {:.0} s after its start",
                    d.node_down.as_secs(),
                    synced.as_secs_f64()
                ),
            };
        }
        Fault::StallNode | Fault::StallCoordinator => {
            let (id, role) = target(fault, c).await;
            let node = cluster::node_component(id);
            stack.signal("-STOP", &node);
            tokio::time::sleep(d.broker_stall).await;
            stack.signal("-CONT", &node);
            let synced = cluster::wait_in_sync(&c.brokers, &SYNCED_TOPICS, BACK_WITHIN).await;
            format!(
                "{node} ({role}) stopped {} s, in sync {:.0} s after",
                d.broker_stall.as_secs(),
                synced.as_secs_f64()
            )
        }
        Fault::RollingRestart => {
            let mut took = Vec::new();
            for n in 1..=c.nodes as i32 {
                let node = cluster::node_component(n);
                let t = Instant::now();
                stack.run(&["restart", &node]).await;
                cluster::wait_in_sync(&c.brokers, &SYNCED_TOPICS, BACK_WITHIN).await;
                took.push(format!("{node} {:.0} s", t.elapsed().as_secs_f64()));
            }
            format!("each back in sync: {}", took.join(", "))
        }
        Fault::KillWorker => {
            let worker = cluster::task_running(&c.connector, BACK_WITHIN, |_| true).await;
            let victim = cluster::worker_component(&worker);
            let killed = Instant::now();
            stack.signal("-KILL", &victim);
            let moved_to = cluster::task_running(&c.connector, BACK_WITHIN, |w| w != worker).await;
            let moved = killed.elapsed();
            stack.run(&["start", &victim]).await;
            format!(
                "{victim} (ran the task); the task moved to {} in {:.0} s",
                cluster::worker_component(&moved_to),
                moved.as_secs_f64()
            )
        }
        Fault::RestartWorkers => {
            let mut took = Vec::new();
            for n in 1..=c.workers {
                let worker = format!("connect-{n}");
                let t = Instant::now();
                stack.run(&["restart", &worker]).await;
                cluster::task_running(&c.connector, BACK_WITHIN, |_| true).await;
                took.push(format!("{worker} {:.0} s", t.elapsed().as_secs_f64()));
            }
            format!("task running again after: {}", took.join(", "))
        }
        single => unreachable!("{single:?} is injected on the single node"),
    };
    Injected {
        from: started,
        what,
    }
}

/// PostgreSQL's faults with a standby, through `scripts/stack` (which knows the nodes).
async fn inject_on_ha(fault: Fault, stack: &Stack, d: Durations) -> Injected {
    let started = Instant::now();
    let took = |t: Instant| format!("{:.1} s", t.elapsed().as_secs_f64());
    let what = match fault {
        Fault::PgFailover => {
            stack.run(&["failover"]).await;
            format!(
                "primary killed, standby promoted, old primary rejoined: {}",
                took(started)
            )
        }
        Fault::PgSwitchover => {
            stack.run(&["switchover"]).await;
            format!(
                "primary stopped, standby promoted, old primary following: {}",
                took(started)
            )
        }
        Fault::PgStandbyKilled => {
            stack.run(&["signal", "standby", "KILL"]).await;
            tokio::time::sleep(d.standby_grace).await;
            stack.run(&["synchronous", "off"]).await;
            let off = took(started);
            let t = Instant::now();
            stack.run(&["rejoin"]).await;
            format!(
                "commits waited until synchronous off at {off}; standby back and synchronous in {}",
                took(t)
            )
        }
        Fault::PgStall => {
            stack.run(&["signal", "primary", "STOP"]).await;
            tokio::time::sleep(d.pg_stall).await;
            stack.run(&["signal", "primary", "CONT"]).await;
            // As on the single node: timed from the end of the stall.
            return Injected {
                from: Instant::now(),
                what: format!("primary stopped {} s", d.pg_stall.as_secs()),
            };
        }
        other => unreachable!("{other:?} is not a PostgreSQL fault"),
    };
    Injected {
        from: started,
        what,
    }
}

async fn restart(services: &mut Services, name: &str, d: Durations) -> Instant {
    services.kill(name).await;
    tokio::time::sleep(d.restart_after).await;
    services.start(name).await;
    Instant::now()
}
