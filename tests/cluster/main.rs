//! The pipeline on a Kafka cluster (three brokers, replication factor 3,
//! min.insync.replicas 2) and a Connect cluster (two workers): a broker or a worker lost
//! under a steady stream of sends loses nothing. Needs `scripts/stack up --cluster` and
//! its variables (`eval "$(scripts/stack env --cluster)"`); `scripts/test` does both.
//! Not run by a plain `cargo test` (`test = false` in Cargo.toml): it fails, rather than
//! skips, when the cluster is not there.

mod broker;
mod connect;

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chatpipe_schemas::ChatEvent;
use chatpipe_tests::stack::component_pid;
pub use chatpipe_tests::stack::{one_fault_at_a_time, run_stack as stack, StartOnPanic};
use chatpipe_tests::stream::{broker_count, brokers, Pipeline, Record};

/// What the issue allows for pushes to come back, and for the connector's task to move.
pub const RECOVERY: Duration = Duration::from_secs(30);

/// The cluster is there, or the test fails saying how to start it.
pub fn require_cluster() {
    let n = broker_count();
    assert!(
        n >= 3,
        "KAFKA_BROKERS={} has {n} broker(s): these tests need the cluster. Run `scripts/stack up --cluster` and `eval \"$(scripts/stack env --cluster)\"`",
        brokers()
    );
}

/// SIGKILL, as a lost machine.
pub fn kill(component: &str) -> i32 {
    let pid = component_pid(component);
    chatpipe_tests::stack::signal("-9", pid);
    pid
}

/// Messages sent one after another by `sender` into `conversation` until stopped; the
/// seqs PostgreSQL acknowledged (201), with when.
pub struct Sender {
    stop: Arc<AtomicBool>,
    pub acked: Arc<Mutex<Vec<(i64, Instant)>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Sender {
    pub fn start(p: &Pipeline, sender: i64, conversation: i64, every: Duration) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let acked = Arc::new(Mutex::new(Vec::new()));
        let (base, http, token) = (p.app.base.clone(), p.app.http.clone(), p.app.token(sender));
        let (stop2, acked2) = (stop.clone(), acked.clone());
        let task = tokio::spawn(async move {
            let mut n = 0;
            while !stop2.load(Ordering::Relaxed) {
                n += 1;
                let body = serde_json::json!({"clientMsgId": uuid::Uuid::new_v4(), "body": format!("steady {n}")});
                let res = http
                    .post(format!("{base}/v1/conversations/{conversation}/messages"))
                    .bearer_auth(&token)
                    .json(&body)
                    .send()
                    .await
                    .expect("ingest-api answers");
                assert_eq!(res.status(), 201, "a send is committed by PostgreSQL alone");
                let seq = res.json::<serde_json::Value>().await.unwrap()["seq"]
                    .as_i64()
                    .unwrap();
                acked2.lock().unwrap().push((seq, Instant::now()));
                tokio::time::sleep(every).await;
            }
        });
        Self { stop, acked, task }
    }

    /// The seqs acknowledged so far.
    pub fn seqs(&self) -> Vec<i64> {
        self.acked.lock().unwrap().iter().map(|(s, _)| *s).collect()
    }

    /// The first seq acknowledged after `t`.
    pub fn first_after(&self, t: Instant) -> Option<i64> {
        self.acked
            .lock()
            .unwrap()
            .iter()
            .find(|(_, at)| *at > t)
            .map(|(s, _)| *s)
    }

    pub async fn stop(self) -> Vec<i64> {
        self.stop.store(true, Ordering::Relaxed);
        self.task.await.expect("every send was acknowledged");
        self.acked.lock().unwrap().iter().map(|(s, _)| *s).collect()
    }
}

/// The seqs of `conversation`'s message.new records.
pub fn seqs_on_topic(records: &[Record], conversation: i64) -> Vec<i64> {
    records
        .iter()
        .filter_map(|r| match &r.event {
            ChatEvent::MessageNew(m) if m.conversation_id.get() == conversation => {
                Some(m.seq.get())
            }
            _ => None,
        })
        .collect()
}

/// Reads chat.events until every seq of `acked` is there (the deadline fails the test),
/// and says how many duplicates it saw.
pub async fn every_acknowledged_on_the_topic(
    p: &Pipeline,
    conversation: i64,
    acked: &[i64],
    deadline: Duration,
) -> usize {
    let want: BTreeSet<i64> = acked.iter().copied().collect();
    let records = p
        .consume_until(deadline, |rs| {
            let seen: BTreeSet<i64> = seqs_on_topic(rs, conversation).into_iter().collect();
            seen.is_superset(&want)
        })
        .await;
    let seen = seqs_on_topic(&records, conversation);
    let unique: BTreeSet<i64> = seen.iter().copied().collect();
    seen.len() - unique.len()
}
