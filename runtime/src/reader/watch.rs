//! Watching that records arrive: a partition fetched no more (the fetch watch) and
//! partitions that lost their leader (the leader watch).

use super::*;

/// Catches a consumer that stopped fetching. After a broker restart librdkafka can leave
/// a partition without a fetcher while everything else looks fine: no error, the client
/// statistics frozen at "no lag" (librdkafka#5153, rust-rdkafka#597; seen here on a
/// gateway's deliveries reader, whose pushes stopped until a restart). When nothing has
/// arrived for `readers.fetch_check_ms`, the reader asks the broker where each of its
/// partitions ends; a partition that ends past the reader's position has records nobody
/// fetches, and is fetched again from that position (a seek restarts its fetcher).
/// Until its records arrive, the reader counts as holding, so `/readyz` turns 503
/// after `stall_after_ms` instead of reporting a silent reader as ready.
pub(super) struct FetchWatch {
    pub(super) every: Duration,
    pub(super) last_record: Instant,
    pub(super) next_check: Instant,
    /// Records seen waiting at the last check (0: none).
    pub(super) stuck: i64,
}

impl FetchWatch {
    pub(super) fn new(every: Duration) -> Self {
        Self {
            every,
            last_record: Instant::now(),
            next_check: Instant::now() + every,
            stuck: 0,
        }
    }

    pub(super) fn due(&self, now: Instant) -> bool {
        now >= self.next_check && now.duration_since(self.last_record) >= self.every
    }

    /// A record arrived: the partitions are being fetched.
    pub(super) fn fetched(&mut self, health: &ReaderHealth, reader: &str) {
        self.last_record = Instant::now();
        health.broker_answered();
        if self.stuck > 0 {
            self.stuck = 0;
            health.release();
            tracing::info!(reader, "records arrive again");
        }
    }
}

/// How long one metadata request for the reader's topic may take.
pub(super) const LEADER_QUERY_TIMEOUT: Duration = Duration::from_secs(1);

/// Catches partitions the client has lost the leader of. A broker that stops moves its
/// partitions to "no leader"; the client parks them and asks for their leaders again,
/// but after a restart that question can stay unasked for tens of seconds (a metadata
/// request lost with the old connection keeps newer ones back), and nothing is fetched
/// from those partitions meanwhile, even from a broker that is back and serving: a
/// restarted broker once left fanout pushing nothing for over 35 s. The client's own
/// statistics (every second) list an assigned partition without a leader; while any is
/// listed, the reader asks the broker for its topic's metadata itself, first after 1 s,
/// then at doubling intervals up to `readers.fetch_check_ms`.
pub(super) struct LeaderWatch {
    pub(super) first: Duration,
    pub(super) most: Duration,
    pub(super) wait: Duration,
    pub(super) next_ask: Instant,
}

impl LeaderWatch {
    pub(super) fn new(most: Duration) -> Self {
        let first = Duration::from_secs(1).min(most);
        Self {
            first,
            most,
            wait: first,
            next_ask: Instant::now() + first,
        }
    }

    /// Asked now: the next question waits twice as long (up to `most`).
    pub(super) fn asked(&mut self, now: Instant) {
        self.next_ask = now + self.wait;
        self.wait = (self.wait * 2).min(self.most);
    }

    /// Every partition has a leader: the next loss is asked about after `first`.
    pub(super) fn calm(&mut self) {
        self.wait = self.first;
        self.next_ask = Instant::now() + self.first;
    }
}

impl<P: Processor> Reader<P> {
    /// Nothing arrived for a while: is that because nothing is there? See [`FetchWatch`].
    pub(super) fn check_fetching(&mut self) {
        self.watch.next_check = Instant::now() + self.watch.every;
        let (topic, name) = (self.spec().topic.clone(), self.spec().name.clone());
        let Ok(positions) = self.consumer.position() else {
            self.ask_whether_the_broker_answers(&topic);
            return;
        };
        let timeout = Duration::from_secs(2);
        let (mut asked, mut answered) = (0, 0);
        let mut waiting = 0;
        let mut refetched = Vec::new();
        let mut lost = Vec::new();
        for e in positions.elements_for_topic(&topic) {
            let Offset::Offset(position) = e.offset() else {
                continue;
            };
            asked += 1;
            let end = match self
                .consumer
                .fetch_watermarks(&topic, e.partition(), timeout)
            {
                Ok((_, end)) => end,
                // The client's metadata no longer has the partition: a broker that was
                // starting answered without it, and an assigned consumer does not ask
                // again. Nothing is fetched from it until it does.
                Err(KafkaError::MetadataFetch(RDKafkaErrorCode::UnknownPartition)) => {
                    lost.push((e.partition(), position));
                    continue;
                }
                // No answer for this partition (its request may wait behind a fetch):
                // the others are still checked.
                Err(_) => continue,
            };
            answered += 1;
            if end > position {
                waiting += end - position;
                let seek =
                    self.consumer
                        .seek(&topic, e.partition(), Offset::Offset(position), timeout);
                if let Err(err) = seek {
                    tracing::warn!(reader = %name, partition = e.partition(), "seek to fetch again: {err}");
                }
                self.core.shared.metrics.refetches.increment(1);
                refetched.push(e.partition());
            }
        }
        if asked > 0 && answered == 0 && lost.is_empty() {
            // The broker does not answer: an outage, which the reader waits out, and
            // says so on /readyz once it lasts `stall_after_ms`.
            self.core.shared.health.broker_silent();
            return;
        }
        if answered > 0 {
            self.core.shared.health.broker_answered();
        } else if asked == 0 {
            // No position to ask about (nothing fetched yet since an assignment).
            self.ask_whether_the_broker_answers(&topic);
        }
        if !lost.is_empty() {
            self.core
                .shared
                .metrics
                .refetches
                .increment(lost.len() as u64);
            self.ask_for_leaders();
        }
        if waiting > 0 || !lost.is_empty() {
            tracing::warn!(
                reader = %name,
                refetched = ?refetched,
                records = waiting,
                unknown_to_the_client = ?lost.iter().map(|(p, _)| *p).collect::<Vec<_>>(),
                "the consumer is not fetching some partitions: fetching them again"
            );
            self.core.shared.health.set_lag(waiting.max(1));
            self.core.shared.health.hold(format!(
                "partitions {refetched:?} have {waiting} records not fetched, partitions {:?} are unknown to the client; fetching again",
                lost.iter().map(|(p, _)| *p).collect::<Vec<_>>()
            ));
        }
        let stuck = waiting.max(i64::from(!lost.is_empty()));
        if stuck == 0 && self.watch.stuck > 0 {
            // Nothing waits any more (what waited was fetched, or is gone).
            self.core.shared.health.release();
        }
        self.watch.stuck = stuck;
    }

    /// Assigned partitions the client knows no leader for (its statistics say so every
    /// second): ask the broker for the topic's metadata, at most every
    /// [`LeaderWatch`]'s interval. See [`LeaderWatch`] for why.
    pub(super) fn watch_leaders(&mut self) {
        let now = Instant::now();
        if now < self.leaders.next_ask {
            return;
        }
        let leaderless = self
            .core
            .shared
            .leaderless
            .lock()
            .expect("leaderless lock")
            .clone();
        if leaderless.is_empty() {
            if self.leaders.wait != self.leaders.first {
                tracing::info!(reader = %self.spec().name, "every partition has a leader again");
            }
            self.leaders.calm();
            return;
        }
        if self.leaders.wait == self.leaders.first {
            tracing::info!(reader = %self.spec().name, partitions = ?leaderless, "no leader known for these partitions: asking the broker");
        }
        self.leaders.asked(now);
        self.ask_for_leaders();
    }

    /// Whether the broker answers at all (a metadata request for the reader's topic),
    /// for /readyz: see [`ReaderHealth::broker_silent`].
    pub(super) fn ask_whether_the_broker_answers(&self, topic: &str) {
        let health = &self.core.shared.health;
        match self
            .consumer
            .fetch_metadata(Some(topic), Duration::from_secs(2))
        {
            Ok(_) => health.broker_answered(),
            Err(_) => health.broker_silent(),
        }
    }

    /// Asks the broker for the topic's metadata (the client takes the leaders it
    /// learns) and, for a reader that assigns its partitions itself, assigns them again
    /// from where it stands (a group reader's partitions are the group's to give).
    pub(super) fn ask_for_leaders(&mut self) {
        let topic = self.spec().topic.clone();
        self.core.shared.metrics.leader_queries.increment(1);
        if let Err(err) = self
            .consumer
            .fetch_metadata(Some(&topic), LEADER_QUERY_TIMEOUT)
        {
            tracing::warn!(reader = %self.spec().name, "asking for the metadata of {topic}: {err}");
            return;
        }
        if !matches!(self.spec().source, Source::Assigned { .. }) {
            return;
        }
        let (Ok(assignment), Ok(positions)) =
            (self.consumer.assignment(), self.consumer.position())
        else {
            return;
        };
        let mut tpl = TopicPartitionList::new();
        for e in assignment.elements_for_topic(&topic) {
            let p = e.partition();
            // Where the reader stands, or where it was assigned if it has read nothing.
            let offset = positions
                .find_partition(&topic, p)
                .map(|e| e.offset())
                .filter(|o| matches!(o, Offset::Offset(_)))
                .unwrap_or(e.offset());
            let _ = tpl.add_partition_offset(&topic, p, offset);
        }
        if let Err(err) = self.consumer.assign(&tpl) {
            tracing::warn!(reader = %self.spec().name, "assigning {topic} again: {err}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leaders_are_asked_for_after_a_second_then_at_doubling_intervals_up_to_the_cap() {
        let mut watch = LeaderWatch::new(Duration::from_secs(5));
        let start = Instant::now();
        assert!(watch.next_ask >= start + Duration::from_millis(900));
        let mut gaps = Vec::new();
        for _ in 0..5 {
            let now = watch.next_ask;
            watch.asked(now);
            gaps.push((watch.next_ask - now).as_secs());
        }
        assert_eq!(gaps, [1, 2, 4, 5, 5]);
        // Every partition led again: the next loss starts from a second.
        watch.calm();
        let now = Instant::now();
        watch.asked(now);
        assert_eq!((watch.next_ask - now).as_secs(), 1);
    }
}
