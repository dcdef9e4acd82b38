//! Send load: how many messages per second a running ingest-api commits, spread over
//! many conversations and, in the same run, all into one (the hot-row case). A
//! measurement, not a test: it prints a summary and writes JSON with the machine.
//!
//!   send-load --base http://127.0.0.1:8080 --secret-file .stack/jwt-secret
//!
//! After each phase it checks the invariant the load could break: every conversation's
//! last_seq equals the number of 201s it got (no gap, no duplicate).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use chatpipe_core::auth::TokenKeys;
use chatpipe_core::UserId;
use clap::Parser;
use hdrhistogram::Histogram;
use serde_json::json;

#[derive(Parser, Debug, Clone)]
struct Args {
    /// The ingest-api to load.
    #[arg(long, default_value = "http://127.0.0.1:8080")]
    base: String,
    /// File holding the server's JWT_SECRET (scripts/demo writes .stack/jwt-secret).
    #[arg(long, default_value = ".stack/jwt-secret")]
    secret_file: String,
    /// Concurrent senders (each its own user and HTTP connection).
    #[arg(long, default_value_t = 32)]
    concurrency: usize,
    /// Conversations in the spread phase.
    #[arg(long, default_value_t = 1000)]
    conversations: usize,
    /// Seconds per phase.
    #[arg(long, default_value_t = 10)]
    seconds: u64,
    /// Where to write the JSON report.
    #[arg(long, default_value = "target/bench/send-load.json")]
    out: String,
}

struct Phase {
    name: &'static str,
    sends: u64,
    errors: u64,
    elapsed: Duration,
    latency_us: Histogram<u64>,
}

impl Phase {
    fn per_second(&self) -> f64 {
        self.sends as f64 / self.elapsed.as_secs_f64()
    }

    fn json(&self) -> serde_json::Value {
        let q = |p: f64| self.latency_us.value_at_quantile(p) as f64 / 1000.0;
        json!({
            "phase": self.name, "sends": self.sends, "errors": self.errors,
            "seconds": self.elapsed.as_secs_f64(), "sends_per_second": self.per_second(),
            "latency_ms": {"p50": q(0.5), "p90": q(0.9), "p99": q(0.99), "max": self.latency_us.max() as f64 / 1000.0},
        })
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let secret = std::fs::read_to_string(&args.secret_file)
        .with_context(|| format!("reading {}", args.secret_file))?;
    let keys = TokenKeys::new(&secret.trim().to_owned().into(), Duration::ZERO)?;
    // Fresh user ids per run so runs never share conversations.
    let base_user = 1_000_000 + (chatpipe_core::auth::unix_now() % 1_000_000) as i64 * 100;
    let users: Vec<i64> = (0..args.concurrency as i64)
        .map(|i| base_user + i)
        .collect();
    let tokens: Vec<String> = users
        .iter()
        .map(|&u| keys.issue(UserId::new(u).unwrap(), Duration::from_secs(3600)))
        .collect();
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(args.concurrency)
        .build()?;

    eprintln!(
        "creating {} conversations of {} members…",
        args.conversations,
        users.len()
    );
    let mut conversations = Vec::with_capacity(args.conversations);
    for _ in 0..args.conversations {
        conversations.push(create_group(&http, &args.base, &tokens[0], &users[1..]).await?);
    }
    let hot = vec![create_group(&http, &args.base, &tokens[0], &users[1..]).await?];

    let spread = run_phase(
        "spread",
        &args,
        &http,
        &tokens,
        Arc::new(conversations.clone()),
    )
    .await?;
    let hot_phase = run_phase("hot", &args, &http, &tokens, Arc::new(hot.clone())).await?;

    let ratio = hot_phase.per_second() / spread.per_second();
    let report = json!({
        "benchmark": "send-load",
        "machine": machine(),
        "args": {"concurrency": args.concurrency, "conversations": args.conversations, "seconds": args.seconds, "base": args.base},
        "phases": [spread.json(), hot_phase.json()],
        "hot_over_spread": ratio,
    });
    if let Some(dir) = std::path::Path::new(&args.out).parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(&args.out, serde_json::to_vec_pretty(&report)?)?;
    for p in [&spread, &hot_phase] {
        let q = |x: f64| p.latency_us.value_at_quantile(x) as f64 / 1000.0;
        println!(
            "{:<7} {:>8.0} sends/s  p50 {:>6.2} ms  p99 {:>6.2} ms  ({} sends, {} errors, {} senders)",
            p.name, p.per_second(), q(0.5), q(0.99), p.sends, p.errors, args.concurrency
        );
    }
    println!(
        "hot/spread throughput ratio: {ratio:.2}   report: {}",
        args.out
    );
    Ok(())
}

async fn create_group(
    http: &reqwest::Client,
    base: &str,
    token: &str,
    members: &[i64],
) -> anyhow::Result<i64> {
    let res = http
        .post(format!("{base}/conversations"))
        .bearer_auth(token)
        .json(&json!({"type": "GROUP", "title": "load", "memberIds": members}))
        .send()
        .await?;
    if res.status() != 201 {
        bail!("creating a group: {} {}", res.status(), res.text().await?);
    }
    res.json::<serde_json::Value>().await?["conversationId"]
        .as_i64()
        .context("conversationId")
}

async fn run_phase(
    name: &'static str,
    args: &Args,
    http: &reqwest::Client,
    tokens: &[String],
    conversations: Arc<Vec<i64>>,
) -> anyhow::Result<Phase> {
    let errors = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let deadline = started + Duration::from_secs(args.seconds);
    let mut workers = Vec::new();
    // Worker w sends to conversations w, w+C, w+2C, …: in the spread phase no two
    // workers contend for one row; in the hot phase all do.
    let step = tokens.len();
    for (w, token) in tokens.iter().enumerate() {
        let (http, token, base) = (http.clone(), token.clone(), args.base.clone());
        let (conversations, errors) = (conversations.clone(), errors.clone());
        workers.push(tokio::spawn(async move {
            let mut hist = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).unwrap();
            let mut created: HashMap<i64, u64> = HashMap::new();
            let mut i = w;
            while Instant::now() < deadline {
                let conv = conversations[i % conversations.len()];
                i += step;
                let t = Instant::now();
                let res = http
                    .post(format!("{base}/conversations/{conv}/messages"))
                    .bearer_auth(&token)
                    .json(&json!({"clientMsgId": uuid::Uuid::new_v4(), "body": "a load-test message of a typical length, about sixty chars"}))
                    .send()
                    .await;
                match res {
                    Ok(r) if r.status() == 201 => {
                        hist.record(t.elapsed().as_micros() as u64).ok();
                        *created.entry(conv).or_default() += 1;
                    }
                    _ => {
                        errors.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
            (hist, created)
        }));
    }
    let mut latency_us = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3)?;
    let mut created: HashMap<i64, u64> = HashMap::new();
    for w in workers {
        let (h, c) = w.await?;
        latency_us.add(h)?;
        for (conv, n) in c {
            *created.entry(conv).or_default() += n;
        }
    }
    let elapsed = started.elapsed();
    // Invariant 1 under load: last_seq of each conversation = its 201s (before this phase: 0).
    for (&conv, &n) in &created {
        let page: serde_json::Value = http
            .get(format!(
                "{}/conversations/{conv}/messages?limit=1",
                args.base
            ))
            .bearer_auth(&tokens[0])
            .send()
            .await?
            .json()
            .await?;
        if page["lastSeq"].as_u64() != Some(n) {
            bail!(
                "conversation {conv}: lastSeq {} but {n} sends succeeded",
                page["lastSeq"]
            );
        }
    }
    let sends = created.values().sum();
    Ok(Phase {
        name,
        sends,
        errors: errors.load(Ordering::Relaxed),
        elapsed,
        latency_us,
    })
}

fn machine() -> serde_json::Value {
    let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
    let cpu = read("/proc/cpuinfo")
        .lines()
        .find(|l| l.starts_with("model name"))
        .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_owned());
    json!({
        "cpus": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        "cpu_model": cpu,
        "kernel": read("/proc/sys/kernel/osrelease").trim(),
        "memory_kb": read("/proc/meminfo").lines().next().unwrap_or("").split_whitespace().nth(1),
    })
}
