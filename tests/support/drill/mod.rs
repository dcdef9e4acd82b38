//! The fault drill: two of every service of ours on the real stack, load for the whole
//! drill, faults one after another, and after each an audit of what was lost.
//!
//! Per fault it counts: acknowledged sends (all so far); of those, missing in PostgreSQL
//! and missing on `chat.events` (after dedupe by `(conversationId, seq)`); seq gaps;
//! duplicates; watermark regressions on `chat.events`; `message.new` frames to users
//! not in the conversation; seqs a client still lacks after it reconnected and caught
//! up over REST; and the recovery time from the end of the fault to the first record on
//! `chat.events` and the first push. Alarms `pipeline audit` raised meanwhile are listed.
//!
//! `scripts/drill` runs the full drill (every fault, `tools/src/bin/drill.rs`); the test
//! suite runs a short one (`tests/drill/`).

pub mod events;
pub mod faults;
pub mod load;
pub mod pushes;
pub mod services;

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chatpipe_core::auth::TokenKeys;
use futures::StreamExt;
use secrecy::SecretString;
use serde::Serialize;

use faults::{Cluster, Durations, Fault, Stack};
use load::{Acks, Clients, World};
use services::{Bins, Env, Services};

/// A send slower than this from its 201 to chat.events counts as held up (the warm-up's
/// slowest is about 1 s on 2 cores).
pub const LATE: Duration = Duration::from_secs(2);

#[derive(Debug, Clone)]
pub struct Config {
    pub faults: Vec<Fault>,
    /// Load after each fault before it is audited (and before the first fault).
    pub settle: Duration,
    /// From the end of a fault, how long pushes may take to come back before each
    /// gateway must push [`pushes::MIN_SHARE`] of its members' messages again.
    pub push_recovery: Duration,
    pub users: usize,
    pub conversations: usize,
    /// Messages a second, in all.
    pub send_rate: u32,
    /// Read marks a second, in all.
    pub read_rate: u32,
    pub durations: Durations,
    pub bins: Bins,
    /// Where the JSON result and the services' logs go.
    pub out: PathBuf,
    /// The repository (for scripts/stack).
    pub repo: PathBuf,
}

/// One row of the drill's table.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Row {
    pub fault: String,
    /// What the fault hit and how long it took to heal, in words (cluster faults).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub what: String,
    /// Acknowledged sends so far, and in this phase.
    pub acked: u64,
    pub acked_in_phase: u64,
    /// Acknowledged sends a second in this phase, and what the load asked for.
    pub send_rate: f64,
    pub send_rate_requested: u32,
    pub missing_in_postgres: u64,
    /// Of the sends given up on, those PostgreSQL committed all the same (counted on
    /// chat.events like acknowledged ones).
    pub abandoned_committed: u64,
    pub missing_on_topic: u64,
    /// message.new events on chat.events that PostgreSQL does not hold (see
    /// `Audit::phantoms`).
    pub phantoms: u64,
    pub gaps: u64,
    pub duplicates: u64,
    pub regressions: u64,
    pub non_member_frames: u64,
    /// Seqs of their conversations some client lacked after its REST catch-up.
    pub ws_missing: u64,
    /// Seconds from the end of the fault (its start, on the cluster) to the first record
    /// on chat.events / push.
    pub topic_recovery_s: Option<f64>,
    /// The longest a send acknowledged in this phase waited for chat.events (seconds):
    /// a partition that stalled shows here though the others flowed.
    pub slowest_to_topic_s: Option<f64>,
    /// Sends of this phase that took longer than [`LATE`] to reach chat.events: how many
    /// conversations a stall held up, where the slowest says for how long.
    pub late_to_topic: u64,
    /// The longest a member's open socket waited for a message of this phase from its
    /// 201, and how many pushes took longer than [`LATE`].
    pub slowest_push_s: Option<f64>,
    pub late_pushes: u64,
    pub push_recovery_s: Option<f64>,
    /// Of the messages clients hold, the share that came by push (the rest over REST).
    pub pushed_share: f64,
    pub reconnects: u64,
    pub send_retries: u64,
    pub abandoned_sends: u64,
    /// Alarms of `pipeline audit` that fired during the phase.
    pub alarms: Vec<String>,
    /// Each gateway's share of its members' messages pushed after the recovery time.
    pub push_shares: Vec<pushes::GatewayShare>,
    /// Gateways with connected clients that pushed less than [`pushes::MIN_SHARE`].
    pub pushes_stopped: Vec<String>,
    /// The auditor's readiness alarm (`probe_failing`) still raised at the row.
    pub not_ready_at_end: Vec<String>,
    /// At the end: metrics a service exports without HELP, or a missing build_info.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub metric_gaps: Vec<String>,
}

impl Row {
    /// What makes the row fail: anything lost, a gateway that stopped pushing, a service
    /// still not ready.
    pub fn failures(&self) -> Vec<String> {
        let mut f = Vec::new();
        if self.lost() > 0 {
            f.push(format!("{} lost", self.lost()));
        }
        f.extend(self.pushes_stopped.iter().cloned());
        f.extend(
            self.not_ready_at_end
                .iter()
                .map(|a| format!("still raised: {a}")),
        );
        f
    }

    /// Everything that must be 0.
    pub fn lost(&self) -> u64 {
        self.missing_in_postgres
            + self.missing_on_topic
            + self.phantoms
            + self.gaps
            + self.regressions
            + self.non_member_frames
            + self.ws_missing
    }
}

/// Runs the drill; returns one row for the warm-up, one per fault and one at the end.
pub async fn run(cfg: Config) -> Vec<Row> {
    let stack = Stack {
        script: cfg.repo.join("scripts/stack"),
        home: std::env::var("STACK_HOME")
            .map(PathBuf::from)
            .unwrap_or_else(|_| cfg.repo.join(".stack")),
    };
    let secret = format!("drill-{}", uuid::Uuid::new_v4().simple());
    let env = Env {
        database_url: chatpipe_database_url(),
        brokers: crate::stream::brokers(),
        registry_url: crate::registry_url(),
        // Every worker of a Connect cluster: the auditor asks the next when one is lost.
        connect_url: crate::cluster::workers().join(","),
        slot: std::env::var("CHATPIPE_OUTBOX_SLOT").unwrap_or_else(|_| "chatpipe_outbox".into()),
        jwt_secret: secret.clone(),
        logs: cfg.out.join("logs"),
        kafka_configs: std::env::var_os("KAFKA_CLIENT_CONFIGS")
            .filter(|d| !d.is_empty())
            .map(PathBuf::from),
    };
    let cluster = Cluster {
        brokers: env.brokers.clone(),
        connector: "chatpipe-outbox".into(),
        connect_group: "chatpipe-connect-cluster".into(),
        nodes: env.brokers.split(',').count(),
        workers: crate::cluster::workers().len(),
    };
    if cfg.faults.iter().any(|f| f.on_ha()) {
        let nodes = std::env::var("CHATPIPE_PG_NODES").unwrap_or_default();
        assert!(
            nodes.split(',').filter(|n| !n.is_empty()).count() == 2,
            "the PostgreSQL faults need a standby (scripts/drill --ha): CHATPIPE_PG_NODES={nodes:?}"
        );
    }
    if cfg.faults.iter().any(|f| f.on_cluster()) {
        assert!(
            cluster.nodes >= 3 && cluster.workers >= 2,
            "the cluster faults need the cluster (scripts/drill --cluster): KAFKA_BROKERS={}, KAFKA_CONNECT_URLS={}",
            env.brokers,
            env.connect_url
        );
    }
    let mut services = Services::new(services::specs(&cfg.bins, &env), env.logs.clone());
    for name in services.names() {
        services.start(&name).await;
    }
    let stop = Arc::new(AtomicBool::new(false));
    // The topic is read until the very end, after the load stopped.
    let stop_reading = Arc::new(AtomicBool::new(false));
    let topic = events::follow(
        &env.brokers,
        &env.registry_url,
        "chat.events",
        stop_reading.clone(),
    );

    let keys = TokenKeys::new(&SecretString::from(secret), Duration::from_secs(5)).unwrap();
    let first_user = 10_000_000 + (rand::random::<u32>() % 1_000_000) as i64 * 10_000;
    let world = Arc::new(World::create(keys, first_user, cfg.users, cfg.conversations).await);
    let conversations: BTreeSet<i64> = world.conversations.keys().copied().collect();
    let clients = Arc::new(Clients::new(&world.users()));
    let sockets = load::connect_all(world.clone(), clients.clone(), stop.clone());
    let connected = Instant::now() + Duration::from_secs(60);
    while clients.connected.load(Ordering::Relaxed) < cfg.users as u64 {
        assert!(
            Instant::now() < connected,
            "{} of {} clients connected after 60 s",
            clients.connected.load(Ordering::Relaxed),
            cfg.users
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let acks = Arc::new(Acks::default());
    let senders = tokio::spawn(load::send(
        world.clone(),
        acks.clone(),
        cfg.send_rate,
        stop.clone(),
    ));
    let readers = tokio::spawn(load::read(
        world.clone(),
        clients.clone(),
        cfg.read_rate,
        stop.clone(),
    ));
    let alarms = Arc::new(Mutex::new(BTreeSet::new()));
    let watcher = tokio::spawn(watch_alarms(alarms.clone(), stop.clone()));

    let audit = Audit {
        world: world.clone(),
        clients: clients.clone(),
        acks: acks.clone(),
        topic: topic.clone(),
        conversations,
        alarms: alarms.clone(),
        pool: sqlx::PgPool::connect(&env.database_url)
            .await
            .expect("PostgreSQL"),
        send_rate: cfg.send_rate,
    };
    let mut rows = Vec::new();
    let mut phase = Phase {
        acked_before: 0,
        started: Instant::now(),
    };
    let loaded = Instant::now();
    tokio::time::sleep(cfg.settle).await;
    rows.push(
        audit
            .row(
                "warm-up",
                Some(loaded + cfg.push_recovery),
                None,
                &mut phase,
            )
            .await,
    );
    print_row(rows.last().unwrap());
    for fault in &cfg.faults {
        eprintln!("drill: injecting {}", fault.name());
        alarms.lock().unwrap().clear();
        let injected = faults::inject(*fault, &mut services, &stack, &cluster, cfg.durations).await;
        let exited = services.exited();
        assert!(
            exited.is_empty(),
            "services exited on their own during {}: {exited:?}",
            fault.name()
        );
        tokio::time::sleep(cfg.settle).await;
        let mut row = audit
            .row(
                fault.name(),
                Some(injected.from + cfg.push_recovery),
                Some(injected.from),
                &mut phase,
            )
            .await;
        row.what = injected.what;
        rows.push(row);
        print_row(rows.last().unwrap());
    }
    // The load stops; everything acknowledged must arrive everywhere.
    stop.store(true, Ordering::Relaxed);
    let _ = senders.await;
    let _ = readers.await;
    for s in sockets {
        let _ = s.await;
    }
    let _ = watcher.await;
    rows.push(
        audit
            .row("end (load stopped)", None, None, &mut phase)
            .await,
    );
    print_row(rows.last().unwrap());
    rows.last_mut().unwrap().metric_gaps = services.metric_gaps().await;
    stop_reading.store(true, Ordering::Relaxed);
    services.stop_all().await;
    std::fs::create_dir_all(&cfg.out).unwrap();
    let file = cfg.out.join("drill.json");
    std::fs::write(&file, serde_json::to_vec_pretty(&rows).unwrap()).unwrap();
    eprintln!("drill: {}", file.display());
    rows
}

/// The database the stack's connector streams from (`DATABASE_URL` names the server).
fn chatpipe_database_url() -> String {
    let db = std::env::var("CHATPIPE_PG_DB").unwrap_or_else(|_| "chatpipe".into());
    crate::with_database(&crate::server_url(), &db)
}

async fn watch_alarms(seen: Arc<Mutex<BTreeSet<String>>>, stop: Arc<AtomicBool>) {
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    while !stop.load(Ordering::Relaxed) {
        if let Ok(r) = http
            .get(format!("{}/report", services::audit_url()))
            .send()
            .await
        {
            if let Ok(report) = r.json::<serde_json::Value>().await {
                let firing = report["firing"].as_array().cloned().unwrap_or_default();
                let mut seen = seen.lock().unwrap();
                for a in firing {
                    if let Some(name) = a["name"].as_str() {
                        seen.insert(name.to_owned());
                    }
                }
            }
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// The auditor's readiness alarm, if it is raised now.
async fn readiness_alarms() -> Vec<String> {
    let report = async {
        let r = reqwest::Client::builder()
            .timeout(Duration::from_secs(2))
            .build()
            .ok()?
            .get(format!("{}/report", services::audit_url()))
            .send()
            .await
            .ok()?;
        r.json::<serde_json::Value>().await.ok()
    };
    let Some(report) = report.await else {
        return vec!["the auditor's /report did not answer".into()];
    };
    report["firing"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|a| a["name"] == "probe_failing")
        .map(|a| format!("probe_failing: {}", a["detail"].as_str().unwrap_or("")))
        .collect()
}

/// Where the current phase began: the sends acknowledged before it, and when.
struct Phase {
    acked_before: u64,
    started: Instant,
}

struct Audit {
    world: Arc<World>,
    clients: Arc<Clients>,
    acks: Arc<Acks>,
    topic: Arc<Mutex<events::Topic>>,
    conversations: BTreeSet<i64>,
    alarms: Arc<Mutex<BTreeSet<String>>>,
    pool: sqlx::PgPool,
    send_rate: u32,
}

impl Audit {
    /// The row of a phase; the push shares count the messages acknowledged from
    /// `pushes_from` (None: not counted) until shortly before now.
    async fn row(
        &self,
        fault: &str,
        pushes_from: Option<Instant>,
        ended: Option<Instant>,
        phase: &mut Phase,
    ) -> Row {
        let started = Instant::now();
        let not_ready_at_end = readiness_alarms().await;
        let acked = self.acks.all.lock().unwrap().clone();
        let acked_in_phase = acked.len() as u64 - phase.acked_before;
        let send_rate = acked_in_phase as f64 / (started - phase.started).as_secs_f64();
        // A send given up on may have committed (its answer lost): then it must reach
        // chat.events like any other.
        let abandoned = self.committed_abandoned().await;
        let on_topic: Vec<(i64, i64)> = acked
            .iter()
            .map(|a| (a.conversation, a.seq))
            .chain(abandoned.iter().copied())
            .collect();
        // CDC and pushes trail the acks: wait (two minutes at most) for the topic.
        let deadline = Instant::now() + Duration::from_secs(120);
        let missing_on_topic = loop {
            let missing = {
                let t = self.topic.lock().unwrap();
                on_topic
                    .iter()
                    .filter(|k| !t.messages.contains_key(k))
                    .count() as u64
            };
            if missing == 0 || Instant::now() > deadline {
                break missing;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        };
        let missing_in_postgres = self.missing_in_postgres(&acked).await;
        let phantoms = self.phantoms().await;
        // Every client catches up over REST (as after a reconnect), then must hold every
        // acknowledged seq of its conversations.
        futures::stream::iter(self.world.users())
            .for_each_concurrent(32, |user| async move {
                load::catch_up(&self.world, &self.clients, user).await;
            })
            .await;
        let mut ws_missing = 0;
        let (mut pushed, mut fetched, mut reconnects, mut non_member) = (0, 0, 0, 0);
        for a in &acked {
            for user in &self.world.conversations[&a.conversation] {
                let seen = self.clients.seen[user].lock().unwrap();
                if !seen
                    .seqs
                    .get(&a.conversation)
                    .is_some_and(|s| s.contains(&a.seq))
                {
                    ws_missing += 1;
                }
            }
        }
        for seen in self.clients.seen.values() {
            let seen = seen.lock().unwrap();
            pushed += seen.pushed - seen.pushed_twice;
            fetched += seen.fetched;
            reconnects += seen.reconnects;
            non_member += seen.non_member_frames;
        }
        let (gaps, duplicates, regressions, topic_recovery, slowest, late) = {
            let t = self.topic.lock().unwrap();
            (
                t.gaps(&self.conversations),
                t.duplicates(&self.conversations),
                t.regressions,
                ended.and_then(|e| t.first_after(e).map(|f| (f - e).as_secs_f64())),
                t.slowest(&acked[phase.acked_before as usize..])
                    .map(|d| d.as_secs_f64()),
                t.later_than(&acked[phase.acked_before as usize..], LATE),
            )
        };
        let push_recovery = ended.and_then(|e| {
            self.clients
                .first_frame_after(e)
                .map(|f| (f - e).as_secs_f64())
        });
        let held = pushed + fetched;
        let (slowest_push, late_pushes) = pushes::delays(
            &acked[phase.acked_before as usize..],
            &self.world,
            &self.clients,
            LATE,
        );
        let push_shares = pushes_from
            .map(|from| {
                pushes::shares(
                    &acked,
                    &self.world,
                    &self.clients,
                    from,
                    started - pushes::IN_FLIGHT,
                )
            })
            .unwrap_or_default();
        let row = Row {
            fault: fault.to_owned(),
            what: String::new(),
            acked: acked.len() as u64,
            acked_in_phase,
            send_rate,
            send_rate_requested: self.send_rate,
            missing_in_postgres,
            abandoned_committed: abandoned.len() as u64,
            missing_on_topic,
            phantoms,
            gaps,
            duplicates,
            regressions,
            non_member_frames: non_member,
            ws_missing,
            topic_recovery_s: topic_recovery,
            slowest_to_topic_s: slowest,
            late_to_topic: late,
            slowest_push_s: slowest_push.map(|d| d.as_secs_f64()),
            late_pushes,
            push_recovery_s: push_recovery,
            pushed_share: if held == 0 {
                0.0
            } else {
                pushed as f64 / held as f64
            },
            reconnects,
            send_retries: self.acks.retries.load(Ordering::Relaxed),
            abandoned_sends: self.acks.abandoned.load(Ordering::Relaxed),
            alarms: self.alarms.lock().unwrap().iter().cloned().collect(),
            pushes_stopped: pushes::stopped(&push_shares),
            push_shares,
            not_ready_at_end,
            metric_gaps: Vec::new(),
        };
        *phase = Phase {
            acked_before: acked.len() as u64,
            started,
        };
        row
    }

    /// The sends given up on that PostgreSQL committed all the same: (conversation, seq).
    async fn committed_abandoned(&self) -> Vec<(i64, i64)> {
        let given_up = self.acks.abandoned_ids.lock().unwrap().clone();
        if given_up.is_empty() {
            return Vec::new();
        }
        let conversations: Vec<i64> = given_up.iter().map(|(c, _)| *c).collect();
        let ids: Vec<uuid::Uuid> = given_up.iter().map(|(_, id)| *id).collect();
        for _ in 0..120 {
            let found: Result<Vec<(i64, i64)>, _> = sqlx::query_as(
                "SELECT m.conversation_id, m.seq FROM unnest($1::bigint[], $2::uuid[]) AS a(c, id)
                   JOIN message m ON m.conversation_id = a.c AND m.client_msg_id = a.id",
            )
            .bind(&conversations)
            .bind(&ids)
            .fetch_all(&self.pool)
            .await;
            match found {
                Ok(found) => return found,
                Err(_) => tokio::time::sleep(Duration::from_millis(500)).await,
            }
        }
        panic!("PostgreSQL did not answer the drill's audit for a minute");
    }

    /// Acknowledged sends without their row (conversation, seq, clientMsgId) in PostgreSQL.
    /// message.new events of the drill's conversations on chat.events whose
    /// (conversation, seq, clientMsgId) PostgreSQL does not hold: events of a transaction
    /// the primary now serving never had (a promoted standby that lacked it), whose seq
    /// it may give to another message.
    async fn phantoms(&self) -> u64 {
        let on_topic: Vec<(i64, i64, uuid::Uuid)> = {
            let t = self.topic.lock().unwrap();
            t.sent
                .iter()
                .filter(|(c, _, _)| self.conversations.contains(c))
                .copied()
                .collect()
        };
        self.not_in_postgres(&on_topic).await
    }

    async fn missing_in_postgres(&self, acked: &[load::Ack]) -> u64 {
        let messages: Vec<(i64, i64, uuid::Uuid)> = acked
            .iter()
            .map(|a| (a.conversation, a.seq, a.client_msg_id))
            .collect();
        self.not_in_postgres(&messages).await
    }

    /// How many of `messages` (conversation, seq, clientMsgId) PostgreSQL has no row of.
    async fn not_in_postgres(&self, messages: &[(i64, i64, uuid::Uuid)]) -> u64 {
        let conversations: Vec<i64> = messages.iter().map(|m| m.0).collect();
        let seqs: Vec<i64> = messages.iter().map(|m| m.1).collect();
        let ids: Vec<uuid::Uuid> = messages.iter().map(|m| m.2).collect();
        for _ in 0..120 {
            let found: Result<i64, _> = sqlx::query_scalar(
                "SELECT count(*) FROM unnest($1::bigint[], $2::bigint[], $3::uuid[]) AS a(c, s, id)
                   JOIN message m ON m.conversation_id = a.c AND m.seq = a.s AND m.client_msg_id = a.id",
            )
            .bind(&conversations)
            .bind(&seqs)
            .bind(&ids)
            .fetch_one(&self.pool)
            .await;
            match found {
                Ok(found) => return messages.len() as u64 - found as u64,
                // PostgreSQL restarting (a drill fault): ask again.
                Err(_) => tokio::time::sleep(Duration::from_millis(500)).await,
            }
        }
        panic!("PostgreSQL did not answer the drill's audit for a minute");
    }
}

/// The table's header and one line per row, as the drill goes.
pub fn print_row(r: &Row) {
    static HEADER: std::sync::Once = std::sync::Once::new();
    HEADER.call_once(|| {
        eprintln!(
            "| fault | acked (phase) | sends/s (asked) | abandoned (committed) | missing PG | missing topic | phantoms | gaps | dups | regressions | non-member frames | WS missing | topic back (s) | push back (s) | slowest to topic (s) | later than 2 s | slowest push (s) | pushes later than 2 s | pushed | pushed by gw 0 / gw 1 after recovery | alarms | fails | what |"
        );
        eprintln!("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    });
    let secs = |s: Option<f64>| s.map_or("-".to_owned(), |s| format!("{s:.1}"));
    eprintln!(
        "| {} | {} ({}) | {:.0} ({}) | {} ({}) | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {:.0}% | {} | {} | {} | {} |",
        r.fault,
        r.acked,
        r.acked_in_phase,
        r.send_rate,
        r.send_rate_requested,
        r.abandoned_sends,
        r.abandoned_committed,
        r.missing_in_postgres,
        r.missing_on_topic,
        r.phantoms,
        r.gaps,
        r.duplicates,
        r.regressions,
        r.non_member_frames,
        r.ws_missing,
        secs(r.topic_recovery_s),
        secs(r.push_recovery_s),
        secs(r.slowest_to_topic_s),
        r.late_to_topic,
        secs(r.slowest_push_s),
        r.late_pushes,
        r.pushed_share * 100.0,
        if r.push_shares.is_empty() {
            "-".to_owned()
        } else {
            r.push_shares
                .iter()
                .map(|s| match s.due {
                    0 => "no clients".to_owned(),
                    due => format!("{:.0}% of {due}", s.share() * 100.0),
                })
                .collect::<Vec<_>>()
                .join(" / ")
        },
        if r.alarms.is_empty() {
            "-".to_owned()
        } else {
            r.alarms.join(", ")
        },
        if r.failures().is_empty() {
            "-".to_owned()
        } else {
            r.failures().join("; ")
        },
        if r.what.is_empty() { "-" } else { &r.what },
    );
}
