//! cdc-latency's third phase: the outbox path at a requested send rate, for Kafka
//! Connect's cost per core (issue 26, item 4). At each `--rates` rate, senders (each its
//! own user, under a person's send limit, in its own conversation) send for
//! `--rate-seconds`; every (conversation, seq) a 201 returned must reach chat.events, and
//! its commit-to-topic latency is counted. The CPU each piece of the machine used during
//! the sends is procfs's; events per second per Connect core is the achieved rate over
//! Kafka Connect's cores.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use chatpipe_core::auth::TokenKeys;
use chatpipe_core::UserId;
use chatpipe_tests::bench::{create_group, send, Arrivals};
use chatpipe_tests::cpu::{describe, CpuSample};
use hdrhistogram::Histogram;
use serde_json::json;

/// Sends per second one sender (one user) is given at most: under `rate_limits.sends`
/// (200/s), so the API's limiter never refuses the benchmark.
const PER_SENDER: f64 = 150.0;

/// What one rate measured.
pub struct Paced {
    pub requested: f64,
    pub achieved: f64,
    pub latency_us: Histogram<u64>,
    pub cpu: BTreeMap<&'static str, f64>,
}

impl Paced {
    fn ms(&self, q: f64) -> f64 {
        self.latency_us.value_at_quantile(q) as f64 / 1000.0
    }

    /// Events per second per core of Kafka Connect.
    pub fn per_connect_core(&self) -> f64 {
        self.achieved / self.cpu.get("kafka-connect").copied().unwrap_or(f64::NAN)
    }

    pub fn print(&self, run: usize) {
        println!(
            "run {run} paced {:>6.0}/s requested, {:>6.0}/s committed: commit -> chat.events p50 {:.1} ms  p99 {:.1} ms  \
             max {:.1} ms; {:.0} events/s per Kafka Connect core; CPU in cores: {}",
            self.requested,
            self.achieved,
            self.ms(0.5),
            self.ms(0.99),
            self.latency_us.max() as f64 / 1000.0,
            self.per_connect_core(),
            describe(&self.cpu),
        );
    }

    pub fn json(&self) -> serde_json::Value {
        json!({
            "requested_per_s": self.requested, "committed_per_s": self.achieved,
            "messages": self.latency_us.len(),
            "latency_ms": {"p50": self.ms(0.5), "p90": self.ms(0.9), "p99": self.ms(0.99),
                           "max": self.latency_us.max() as f64 / 1000.0},
            "cpu_cores": self.cpu,
            "events_per_s_per_connect_core": self.per_connect_core(),
        })
    }
}

/// Sends at `rate` per second for `seconds`, waits until every message is on the
/// topic (failing the run if one is not within 120 s), and measures.
pub async fn run(
    http: &reqwest::Client,
    base: &str,
    keys: &TokenKeys,
    arrivals: &Arrivals,
    rate: f64,
    seconds: u64,
) -> anyhow::Result<Paced> {
    let senders = ((rate / PER_SENDER).ceil() as usize).max(1);
    let first_user = 3_000_000 + (chatpipe_core::auth::unix_now() % 1_000_000) as i64 * 100;
    let mut setup = Vec::with_capacity(senders);
    for i in 0..senders {
        let user = UserId::new(first_user + i as i64).expect("a positive id");
        let token = keys.issue(user, Duration::from_secs(3600));
        let conv = create_group(http, base, &token, &[]).await?;
        setup.push((token, conv));
    }
    let period = Duration::from_secs_f64(senders as f64 / rate);
    let cpu_before = CpuSample::now();
    let started = Instant::now();
    let deadline = started + Duration::from_secs(seconds);
    let tasks = setup.into_iter().map(|(token, conv)| {
        let (http, base) = (http.clone(), base.to_owned());
        tokio::spawn(async move {
            let mut pace = tokio::time::interval(period);
            // A late send is sent at once, then the pace goes on from it.
            pace.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut sent = Vec::new();
            while Instant::now() < deadline {
                pace.tick().await;
                let (seq, at) = send(&http, &base, &token, conv).await?;
                sent.push(((conv, seq), at));
            }
            anyhow::Ok(sent)
        })
    });
    let mut committed = Vec::new();
    for t in futures::future::join_all(tasks).await {
        committed.extend(t??);
    }
    let elapsed = started.elapsed();
    let cpu = CpuSample::now().cores_since(&cpu_before);

    let mut latency_us = Histogram::<u64>::new_with_bounds(1, 600_000_000, 3)?;
    let limit = Instant::now() + Duration::from_secs(120);
    loop {
        let missing = {
            let arrived = arrivals.lock().await;
            committed
                .iter()
                .filter(|(k, _)| !arrived.contains_key(k))
                .count()
        };
        if missing == 0 {
            break;
        }
        anyhow::ensure!(
            Instant::now() < limit,
            "{missing} of {} paced messages ({rate}/s) not on the topic within 120 s",
            committed.len()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let arrived = arrivals.lock().await;
    for (key, at) in &committed {
        let landed = arrived[key].saturating_duration_since(*at);
        latency_us.record(landed.as_micros().max(1) as u64)?;
    }
    Ok(Paced {
        requested: rate,
        achieved: committed.len() as f64 / elapsed.as_secs_f64(),
        latency_us,
        cpu,
    })
}
