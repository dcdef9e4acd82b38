//! Commit-to-topic latency and burst drain time of the outbox path, on the real stack:
//! ingest-api -> PostgreSQL -> Debezium -> chat.events. A measurement, not a test.
//!
//!   eval "$(scripts/stack env)"; cdc-latency --base http://127.0.0.1:8080 --secret-file .stack/jwt-secret
//!
//! Phase 1 sends `--messages` (1,000) one at a time and, for each, measures from the
//! 201 (the commit) to the moment this process reads the record from chat.events.
//! Phase 2 sends a burst of `--burst` (10,000) with 32 concurrent senders and waits until
//! every (conversation, seq) the 201s returned is on the topic; any missing one fails the
//! run. Rows and transactions are PostgreSQL's counts (see `pgstats`), records on the
//! topic are Kafka's (end offsets). `--repeat N` runs both phases N times. Writes JSON
//! with the machine.
//!
//! `--rates 1000,2000,4000` adds a phase per rate: sends at that rate for `--rate-seconds`
//! and measures commit-to-topic latency and Kafka Connect's CPU (`cdc_paced`);
//! `--only-rates` runs those alone.

#[path = "../cdc_paced.rs"]
mod cdc_paced;

use std::collections::HashSet;
use std::time::{Duration, Instant};

use anyhow::Context;
use chatpipe_core::auth::TokenKeys;
use chatpipe_core::UserId;
use chatpipe_tests::bench::{
    create_group, machine, records_on, send, start_event_reader, wait_for, Arrivals, Runs,
};
use chatpipe_tests::pgstats::{PgArgs, PgStats};
use clap::Parser;
use hdrhistogram::Histogram;
use serde_json::json;

#[derive(Parser)]
struct Args {
    #[arg(long, default_value = "http://127.0.0.1:8080")]
    base: String,
    #[arg(long, default_value = ".stack/jwt-secret")]
    secret_file: String,
    #[command(flatten)]
    stack: chatpipe_tests::bench::StackArgs,
    #[command(flatten)]
    pg: PgArgs,
    #[arg(long, default_value = "chat.events")]
    topic: String,
    #[arg(long, default_value_t = 1000)]
    messages: usize,
    #[arg(long, default_value_t = 10_000)]
    burst: usize,
    #[arg(long, default_value_t = 32)]
    concurrency: usize,
    /// Requested send rates (messages/s) of the paced phases, comma-separated.
    #[arg(long, value_delimiter = ',')]
    rates: Vec<f64>,
    /// How long each paced phase sends.
    #[arg(long, default_value_t = 10)]
    rate_seconds: u64,
    /// Only the paced phases.
    #[arg(long)]
    only_rates: bool,
    /// Runs of both phases; the summary gives median and spread.
    #[arg(long, default_value_t = 1)]
    repeat: usize,
    #[arg(long, default_value = "target/bench/cdc-latency.json")]
    out: String,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    anyhow::ensure!(args.repeat >= 1, "--repeat must be at least 1");
    let secret =
        std::fs::read_to_string(&args.secret_file).with_context(|| args.secret_file.clone())?;
    let keys = TokenKeys::new(&secret.trim().to_owned().into(), Duration::ZERO)?;
    let user = 2_000_000 + (chatpipe_core::auth::unix_now() % 1_000_000) as i64;
    let token = keys.issue(UserId::new(user).unwrap(), Duration::from_secs(3600));
    let http = reqwest::Client::new();
    let mut stats = args.pg.connect().await?;

    let arrivals = Arrivals::default();
    let reader = start_event_reader(
        &args.stack.brokers,
        &args.stack.registry,
        &args.topic,
        arrivals.clone(),
    )
    .await?;

    let mut runs = Runs::default();
    let mut reports = Vec::new();
    for r in 0..args.repeat {
        let mut report = if args.only_rates {
            json!({"run": r + 1})
        } else {
            run(&args, &http, &token, &arrivals, &mut stats, r, &mut runs).await?
        };
        let mut paced = Vec::new();
        for &rate in &args.rates {
            let p = cdc_paced::run(&http, &args.base, &keys, &arrivals, rate, args.rate_seconds)
                .await?;
            p.print(r + 1);
            let name = format!("paced_{rate}");
            runs.record(&format!("{name}.committed_per_s"), p.achieved);
            runs.record(
                &format!("{name}.p99_ms"),
                p.json()["latency_ms"]["p99"].as_f64().unwrap_or(f64::NAN),
            );
            runs.record(
                &format!("{name}.events_per_s_per_connect_core"),
                p.per_connect_core(),
            );
            paced.push(p.json());
        }
        report["paced"] = json!(paced);
        reports.push(report);
    }
    reader.abort();
    if args.repeat > 1 {
        runs.print();
    }

    let report = json!({
        "benchmark": "cdc-latency",
        "machine": machine(),
        "args": {"messages": args.messages, "burst": args.burst, "senders": args.concurrency,
                 "repeat": args.repeat, "topic": args.topic, "database": args.pg.database,
                 "rates": args.rates, "rate_seconds": args.rate_seconds},
        "runs": reports,
        "summary": runs.json(),
    });
    chatpipe_tests::bench::write_report(&args.out, &report)?;
    Ok(())
}

/// Both phases once; prints them and returns their JSON.
async fn run(
    args: &Args,
    http: &reqwest::Client,
    token: &str,
    arrivals: &Arrivals,
    stats: &mut PgStats,
    r: usize,
    runs: &mut Runs,
) -> anyhow::Result<serde_json::Value> {
    // Phase 1: one at a time, commit -> topic.
    let conv = create_group(http, &args.base, token, &[]).await?;
    let before = args.pg.settled(stats).await?;
    let mut latency = Histogram::<u64>::new_with_bounds(1, 600_000_000, 3)?;
    let started = Instant::now();
    for _ in 0..args.messages {
        let (seq, committed) = send(http, &args.base, token, conv).await?;
        let arrived = wait_for(arrivals, (conv, seq), Duration::from_secs(60)).await?;
        latency.record(
            arrived
                .saturating_duration_since(committed)
                .as_micros()
                .max(1) as u64,
        )?;
    }
    let one_by_one = started.elapsed();
    let single_db = args.pg.settled(stats).await?.since(&before);
    let ms = |q: f64| latency.value_at_quantile(q) as f64 / 1000.0;
    println!(
        "run {} commit -> chat.events over {} messages: p50 {:.1} ms  p90 {:.1} ms  p99 {:.1} ms  max {:.1} ms \
         ({:.0} messages/s, one at a time; PostgreSQL: {} messages inserted, {} transactions{})",
        r + 1,
        args.messages,
        ms(0.5),
        ms(0.9),
        ms(0.99),
        latency.max() as f64 / 1000.0,
        args.messages as f64 / one_by_one.as_secs_f64(),
        single_db.table("message").inserted,
        single_db.commits,
        single_db.caveat(),
    );
    for (name, q) in [("p50", 0.5), ("p90", 0.9), ("p99", 0.99), ("max", 1.0)] {
        runs.record(&format!("latency_{name}_ms"), ms(q));
    }

    // Phase 2: a burst over `concurrency` conversations.
    let mut convs = Vec::new();
    for _ in 0..args.concurrency {
        convs.push(create_group(http, &args.base, token, &[]).await?);
    }
    let before = args.pg.settled(stats).await?;
    let records_before =
        tokio::task::block_in_place(|| records_on(&args.stack.brokers, &args.topic))?;
    let started = Instant::now();
    // Sender i sends burst/concurrency messages, the first burst%concurrency one more.
    let share =
        |i: usize| args.burst / args.concurrency + usize::from(i < args.burst % args.concurrency);
    let senders = convs.iter().enumerate().map(|(i, &c)| {
        let (http, base, token, n) = (http.clone(), args.base.clone(), token.to_owned(), share(i));
        tokio::spawn(async move {
            let mut sent = Vec::with_capacity(n);
            for _ in 0..n {
                let (seq, at) = send(&http, &base, &token, c).await?;
                sent.push((c, seq, at));
            }
            anyhow::Ok(sent)
        })
    });
    let mut last_commit = started;
    let mut expected = HashSet::new();
    for s in futures::future::join_all(senders).await {
        for (c, seq, at) in s?? {
            last_commit = last_commit.max(at);
            expected.insert((c, seq));
        }
    }
    let committed = started.elapsed();
    let sent = expected.len();
    anyhow::ensure!(
        sent == args.burst,
        "{} of {} sends were answered with a distinct (conversation, seq)",
        sent,
        args.burst
    );
    // Every (conversation, seq) of the burst on the topic: the set difference must empty.
    let deadline = Instant::now() + Duration::from_secs(300);
    let (landed, missing) = loop {
        let (landed, missing) = {
            let arrived = arrivals.lock().await;
            let missing: Vec<(i64, i64)> = expected
                .iter()
                .filter(|k| !arrived.contains_key(k))
                .copied()
                .collect();
            let landed = expected
                .iter()
                .filter_map(|k| arrived.get(k))
                .max()
                .copied();
            (landed, missing)
        };
        if missing.is_empty() || Instant::now() > deadline {
            break (landed.unwrap_or(started), missing);
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    if !missing.is_empty() {
        let mut sample = missing.clone();
        sample.sort_unstable();
        sample.truncate(10);
        anyhow::bail!(
            "{} of the burst's {sent} messages never reached {} within 300 s, e.g. (conversation, seq) {sample:?}",
            missing.len(),
            args.topic
        );
    }
    let records_after =
        tokio::task::block_in_place(|| records_on(&args.stack.brokers, &args.topic))?;
    let burst_db = args.pg.settled(stats).await?.since(&before);
    let total = landed.duration_since(started);
    let drain = landed.saturating_duration_since(last_commit);
    println!(
        "run {} burst of {sent} from {} senders: all committed after {:.2} s ({:.0}/s; no rate requested: \
         as fast as the senders get answers), every one on {} after {:.2} s; last record {:.0} ms after the last commit",
        r + 1,
        args.concurrency,
        committed.as_secs_f64(),
        sent as f64 / committed.as_secs_f64(),
        args.topic,
        total.as_secs_f64(),
        drain.as_secs_f64() * 1000.0
    );
    println!(
        "    PostgreSQL: {} messages inserted, {} outbox rows, {} transactions{}; Kafka: {} records appended to {} (offsets, anyone's)",
        burst_db.table("message").inserted,
        burst_db.table("outbox").inserted,
        burst_db.commits,
        burst_db.caveat(),
        records_after - records_before,
        args.topic,
    );
    runs.record("burst_committed_s", committed.as_secs_f64());
    runs.record("burst_commits_per_s", sent as f64 / committed.as_secs_f64());
    runs.record("burst_landed_s", total.as_secs_f64());
    runs.record(
        "burst_drain_after_last_commit_ms",
        drain.as_secs_f64() * 1000.0,
    );
    runs.record("burst_transactions", burst_db.commits as f64);

    Ok(json!({
        "run": r + 1,
        "latency_ms": {"messages": args.messages, "p50": ms(0.5), "p90": ms(0.9), "p99": ms(0.99), "max": latency.max() as f64 / 1000.0,
                       "messages_per_s": args.messages as f64 / one_by_one.as_secs_f64(), "postgres": single_db.json()},
        "burst": {"messages": sent, "senders": args.concurrency, "committed_s": committed.as_secs_f64(),
                  "commits_per_s": sent as f64 / committed.as_secs_f64(), "requested_rate": null,
                  "landed_s": total.as_secs_f64(), "drain_after_last_commit_ms": drain.as_secs_f64() * 1000.0,
                  "missing": 0, "topic_records_appended": records_after - records_before,
                  "postgres": burst_db.json()},
    }))
}
