//! What the auditor watches of the clusters under us: partitions of our topics that are
//! under-replicated (fewer in-sync replicas than replicas: one more loss and acks=all
//! writes are refused) or offline (no leader: nobody can write or read them), from the
//! cluster's metadata; and a connector task that keeps moving between Connect workers
//! (a worker restarting in a loop, or rebalances that never settle).

use std::collections::VecDeque;
use std::time::Duration;

use chatpipe_core::kafka::BaseConsumer;
use rdkafka::consumer::Consumer;
use serde::Serialize;
use tokio::time::Instant;

/// One partition as the metadata tells it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionState {
    pub topic: String,
    pub partition: i32,
    /// -1: no leader.
    pub leader: i32,
    pub replicas: usize,
    pub in_sync: usize,
}

/// What the last look at the metadata found, for `/report`.
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Replication {
    /// Brokers the metadata lists.
    pub brokers: usize,
    /// Partitions of the watched topics looked at.
    pub partitions: usize,
    /// `topic/partition (in sync of replicas)`.
    pub under_replicated: Vec<String>,
    /// `topic/partition`.
    pub offline: Vec<String>,
    /// Watched topics the metadata did not have.
    pub missing: Vec<String>,
}

impl Replication {
    pub fn of(brokers: usize, partitions: &[PartitionState], missing: Vec<String>) -> Self {
        let mut r = Replication {
            brokers,
            partitions: partitions.len(),
            missing,
            ..Default::default()
        };
        for p in partitions {
            if p.leader < 0 {
                r.offline.push(format!("{}/{}", p.topic, p.partition));
            } else if p.in_sync < p.replicas {
                r.under_replicated.push(format!(
                    "{}/{} ({} of {} in sync)",
                    p.topic, p.partition, p.in_sync, p.replicas
                ));
            }
        }
        r
    }
}

/// Reads the metadata of `topics` (blocking: call it off the async workers). `None`
/// when the cluster did not answer.
pub fn read(kafka: &BaseConsumer, topics: &[String], timeout: Duration) -> Option<Replication> {
    let metadata = kafka.fetch_metadata(None, timeout).ok()?;
    let mut partitions = Vec::new();
    let mut missing = Vec::new();
    for topic in topics {
        let Some(t) = metadata
            .topics()
            .iter()
            .find(|t| t.name() == topic && t.error().is_none())
        else {
            missing.push(topic.clone());
            continue;
        };
        partitions.extend(t.partitions().iter().map(|p| PartitionState {
            topic: topic.clone(),
            partition: p.id(),
            leader: p.leader(),
            replicas: p.replicas().len(),
            in_sync: p.isr().len(),
        }));
    }
    Some(Replication::of(
        metadata.brokers().len(),
        &partitions,
        missing,
    ))
}

/// How often the connector's task changed workers lately.
#[derive(Debug, Default)]
pub struct TaskMoves {
    worker: Option<String>,
    moves: VecDeque<Instant>,
}

impl TaskMoves {
    /// The task runs on `worker` now (None: it runs nowhere); returns the moves within
    /// `window` up to `now`. A task that stops and starts again on the same worker has
    /// not moved.
    pub fn observe(&mut self, worker: Option<&str>, window: Duration, now: Instant) -> usize {
        if let Some(w) = worker {
            if self.worker.as_deref().is_some_and(|before| before != w) {
                self.moves.push_back(now);
            }
            self.worker = Some(w.to_owned());
        }
        while self
            .moves
            .front()
            .is_some_and(|t| now.duration_since(*t) > window)
        {
            self.moves.pop_front();
        }
        self.moves.len()
    }

    pub fn worker(&self) -> Option<&str> {
        self.worker.as_deref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(partition: i32, leader: i32, replicas: usize, in_sync: usize) -> PartitionState {
        PartitionState {
            topic: "chat.events".into(),
            partition,
            leader,
            replicas,
            in_sync,
        }
    }

    #[test]
    fn a_partition_without_a_leader_is_offline_and_one_short_of_replicas_under_replicated() {
        let r = Replication::of(
            3,
            &[p(0, 1, 3, 3), p(1, 2, 3, 2), p(2, -1, 3, 0), p(3, 1, 1, 1)],
            vec!["chat.gone".into()],
        );
        assert_eq!(r.under_replicated, ["chat.events/1 (2 of 3 in sync)"]);
        assert_eq!(r.offline, ["chat.events/2"]);
        assert_eq!(r.missing, ["chat.gone"]);
        assert_eq!((r.brokers, r.partitions), (3, 4));
    }

    #[tokio::test(start_paused = true)]
    async fn moves_are_counted_in_the_window_and_a_restart_in_place_is_none() {
        let window = Duration::from_secs(600);
        let mut moves = TaskMoves::default();
        assert_eq!(moves.observe(Some("a:1"), window, Instant::now()), 0);
        assert_eq!(moves.observe(None, window, Instant::now()), 0);
        assert_eq!(moves.observe(Some("a:1"), window, Instant::now()), 0);
        assert_eq!(moves.observe(Some("b:2"), window, Instant::now()), 1);
        tokio::time::advance(Duration::from_secs(300)).await;
        assert_eq!(moves.observe(Some("a:1"), window, Instant::now()), 2);
        tokio::time::advance(Duration::from_secs(301)).await;
        assert_eq!(moves.observe(Some("a:1"), window, Instant::now()), 1);
        assert_eq!(moves.worker(), Some("a:1"));
    }
}
