//! The Kafka and Connect clusters of `scripts/stack up --cluster`, as the cluster tests and
//! the cluster drill see them: who leads a partition, who is in sync, which node is the
//! active KRaft controller, which Connect worker runs the connector's task.

use std::time::{Duration, Instant};

use chatpipe_core::kafka::CreateGuarded;
use rdkafka::consumer::Consumer;
use serde_json::Value;

fn metadata_client(brokers: &str) -> chatpipe_core::kafka::BaseConsumer {
    chatpipe_core::kafka::client_config(brokers)
        .create_guarded()
        .expect("Kafka client")
}

/// The node id of the leader of `topic`'s `partition`, and the ids of its in-sync
/// replicas.
pub fn leader_and_isr(brokers: &str, topic: &str, partition: i32) -> (i32, Vec<i32>) {
    let metadata = metadata_client(brokers)
        .fetch_metadata(Some(topic), Duration::from_secs(10))
        .expect("the cluster's metadata");
    let p = metadata.topics()[0]
        .partitions()
        .iter()
        .find(|p| p.id() == partition)
        .unwrap_or_else(|| panic!("{topic} has no partition {partition}"));
    (p.leader(), p.isr().to_vec())
}

/// The partitions of `topics` with fewer in-sync replicas than replicas, or no leader,
/// as `topic/partition` (empty: everything is in sync). An error when the cluster does
/// not answer.
pub fn out_of_sync(brokers: &str, topics: &[&str]) -> Result<Vec<String>, String> {
    let client = metadata_client(brokers);
    let mut out = Vec::new();
    for topic in topics {
        let metadata = client
            .fetch_metadata(Some(topic), Duration::from_secs(5))
            .map_err(|e| e.to_string())?;
        for t in metadata.topics() {
            if let Some(e) = t.error() {
                return Err(format!("{topic}: {e:?}"));
            }
            for p in t.partitions() {
                if p.leader() < 0 || p.isr().len() < p.replicas().len() {
                    out.push(format!("{topic}/{}", p.id()));
                }
            }
        }
    }
    Ok(out)
}

/// Waits until every partition of `topics` has all its replicas in sync (a restarted
/// broker caught up); how long it took. Fails after `deadline`.
pub async fn wait_in_sync(brokers: &str, topics: &[&str], deadline: Duration) -> Duration {
    let started = Instant::now();
    loop {
        let (b, t) = (
            brokers.to_owned(),
            topics.iter().map(|t| t.to_string()).collect::<Vec<_>>(),
        );
        let state = tokio::task::spawn_blocking(move || {
            let t: Vec<&str> = t.iter().map(String::as_str).collect();
            out_of_sync(&b, &t)
        })
        .await
        .expect("metadata task");
        if state.as_ref().is_ok_and(Vec::is_empty) {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < deadline,
            "the cluster was not in sync within {deadline:?}: {state:?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The node coordinating consumer or Connect group `group`: the leader of its partition
/// of `__consumer_offsets`, which Kafka picks as `abs(groupId.hashCode()) % partitions`
/// (Java's `String.hashCode`).
pub fn group_coordinator(brokers: &str, group: &str) -> i32 {
    let hash = java_hash(group);
    let abs = if hash == i32::MIN { 0 } else { hash.abs() };
    let partitions = metadata_client(brokers)
        .fetch_metadata(Some("__consumer_offsets"), Duration::from_secs(10))
        .expect("the cluster's metadata")
        .topics()[0]
        .partitions()
        .len() as i32;
    leader_and_isr(brokers, "__consumer_offsets", abs % partitions).0
}

/// Java's `String.hashCode`: over UTF-16 code units, `h * 31 + c`, wrapping.
fn java_hash(s: &str) -> i32 {
    s.encode_utf16()
        .fold(0i32, |h, c| h.wrapping_mul(31).wrapping_add(i32::from(c)))
}

/// The node id of the active KRaft controller (`scripts/stack controller --cluster`).
pub async fn active_controller() -> i32 {
    let out = tokio::process::Command::new(crate::stack::repo_root().join("scripts/stack"))
        .args(["controller", "--cluster"])
        .output()
        .await
        .expect("scripts/stack runs");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "scripts/stack controller --cluster: {}{}",
        text,
        String::from_utf8_lossy(&out.stderr)
    );
    text.trim()
        .parse()
        .unwrap_or_else(|_| panic!("a node id, not {text:?}"))
}

/// The component name `scripts/stack` gives cluster node `id`.
pub fn node_component(id: i32) -> String {
    format!("kafka-{id}")
}

/// The Connect workers' REST URLs, in the order of their names (connect-1, connect-2):
/// `KAFKA_CONNECT_URLS` from `scripts/stack env --cluster` (the one worker otherwise).
pub fn workers() -> Vec<String> {
    std::env::var("KAFKA_CONNECT_URLS")
        .unwrap_or_else(|_| crate::stream::connect_url())
        .split(',')
        .map(str::to_owned)
        .collect()
}

/// The connector's status as the first live worker tells it (`null` if none answers).
pub async fn connector_status(connector: &str) -> Value {
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(3))
        .build()
        .unwrap();
    for w in workers() {
        if let Ok(r) = http
            .get(format!("{w}/connectors/{connector}/status"))
            .send()
            .await
        {
            if let Ok(v) = r.json::<Value>().await {
                return v;
            }
        }
    }
    Value::Null
}

/// The worker (`connect-N`) whose REST address is `worker_id` (`127.0.0.1:8183`).
pub fn worker_component(worker_id: &str) -> String {
    let i = workers()
        .iter()
        .position(|w| w.ends_with(worker_id))
        .unwrap_or_else(|| panic!("no worker at {worker_id} among {:?}", workers()));
    format!("connect-{}", i + 1)
}

/// The worker running task 0, once it runs.
pub fn running_on(status: &Value) -> Option<String> {
    let task = &status["tasks"][0];
    (task["state"] == "RUNNING")
        .then(|| task["worker_id"].as_str().map(str::to_owned))
        .flatten()
}

/// Waits until the connector's task runs on a worker `accept` takes; that worker.
pub async fn task_running(
    connector: &str,
    deadline: Duration,
    accept: impl Fn(&str) -> bool,
) -> String {
    let started = Instant::now();
    loop {
        let status = connector_status(connector).await;
        if let Some(w) = running_on(&status).filter(|w| accept(w)) {
            return w;
        }
        assert!(
            started.elapsed() < deadline,
            "the connector's task was not running as wanted within {deadline:?}: {status}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::java_hash;

    #[test]
    fn a_group_hashes_as_java_strings_do() {
        assert_eq!(java_hash(""), 0);
        assert_eq!(java_hash("ab"), 97 * 31 + 98);
        // Java: "hello world".hashCode() == 1794106052; a longer one wraps below zero
        // (our Connect group: partition 2 of __consumer_offsets' 10).
        assert_eq!(java_hash("hello world"), 1794106052);
        assert_eq!(java_hash("chatpipe-connect-cluster"), -943_668_912);
    }
}
