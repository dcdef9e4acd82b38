//! Send load: how many messages per second a running ingest-api commits, spread over
//! many conversations and, in the same run, all into one (the hot-row case). A
//! measurement, not a test: it prints a summary and writes JSON with the machine.
//!
//!   eval "$(scripts/stack env)"; send-load --base http://127.0.0.1:8080 --secret-file .stack/jwt-secret
//!
//! Each sender is one user in a closed loop: on a fast machine one user sends more than
//! the per-user limit (`rate_limits.sends`, 200/s), and the 429s are counted as errors
//! by cause. To measure the send path rather than the limiter's refusals, start the API
//! with the limit raised (`CHATPIPE_RATE_LIMITS__SENDS__RATE=100000`,
//! `CHATPIPE_RATE_LIMITS__SENDS__BURST=100000`): the limiter still runs on every send.
//!
//! Each run ends with the baseline the issue's goals are stated against: the design's
//! send SQL run raw by pgbench on the same server (see `pgbench`), and the API's
//! throughput as ratios of it: spread/seed, spread/one statement, hot/seed hot.
//!
//! With `--replies F --mentions F` each run has two phases more, on conversations of
//! their own: the same spread and hot load where a fraction F of the sends reply in a
//! thread (to the sender's first message of the conversation) and a fraction name a
//! member, and the ratio of each to its plain phase (issue 29: at least 0.9).
//!
//! After each phase it checks the invariant the load could break: the seqs the 201s
//! returned for each conversation are exactly 1..=n with no duplicate, the stored
//! `message` rows of the conversation are exactly those seqs, and its last_seq is n.
//! What the database did (rows, transactions, statements) is PostgreSQL's own count
//! (see `pgstats`), read from `--database` (the stack's `chatpipe`, which the API writes).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use chatpipe_core::auth::TokenKeys;
use chatpipe_core::UserId;
use chatpipe_tests::bench::{machine, Runs};
use chatpipe_tests::cpu::{describe, CpuSample};
use chatpipe_tests::pgbench::{Pgbench, Script};
use chatpipe_tests::pgstats::{Delta, PgArgs, PgStats};
use clap::Parser;
use hdrhistogram::Histogram;
use serde_json::json;
use sqlx::Connection;

#[path = "../send_load_wrk.rs"]
mod wrk;

/// Who sends the requests.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum Generator {
    /// This program's own senders (reqwest, one task and connection per sender).
    Rust,
    /// `wrk` (Debian's package) with a Lua script: an independent generator.
    Wrk,
}

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
    /// Sends per second requested across all senders; without it each sender sends its
    /// next message as soon as the last one is answered (a closed loop).
    #[arg(long)]
    rate: Option<f64>,
    /// Runs (each with new conversations); the summary gives median and spread.
    #[arg(long, default_value_t = 1)]
    repeat: usize,
    #[command(flatten)]
    pg: PgArgs,
    /// Skip the baseline: after each run's phases, the design's send SQL run raw by
    /// pgbench on a scratch database of the same server (tests/bench/pgbench/), for
    /// `--seconds` per workload; the API's figures are printed as ratios of it.
    #[arg(long)]
    no_baseline: bool,
    /// pgbench's clients for the baseline.
    #[arg(long, default_value_t = 16)]
    baseline_clients: usize,
    /// Who sends: this program's senders, or wrk (closed loop only, no `--rate`).
    #[arg(long, value_enum, default_value_t = Generator::Rust)]
    generator: Generator,
    /// Where to write the JSON report.
    #[arg(long, default_value = "target/bench/send-load.json")]
    out: String,
    /// The fraction of sends that reply in a thread, in the mixed phases (0: no mixed
    /// phases unless --mentions).
    #[arg(long, default_value_t = 0.0)]
    replies: f64,
    /// The fraction of sends that name a member, in the mixed phases.
    #[arg(long, default_value_t = 0.0)]
    mentions: f64,
}

/// Which sends of a sender are replies and which name a member: every `reply_every`-th
/// and every `mention_every`-th (0: none).
#[derive(Debug, Clone, Copy, Default)]
struct Mix {
    reply_every: u64,
    mention_every: u64,
}

impl Mix {
    fn of(args: &Args) -> Option<Self> {
        let every = |f: f64| {
            if f > 0.0 {
                (1.0 / f).round().max(1.0) as u64
            } else {
                0
            }
        };
        (args.replies > 0.0 || args.mentions > 0.0).then(|| Self {
            reply_every: every(args.replies),
            mention_every: every(args.mentions),
        })
    }

    /// The body of a sender's send number `n` (from 0, offset by the sender's index) to
    /// a conversation where its first message is `root`, if any; `other` is another
    /// member.
    fn body(&self, n: u64, root: Option<i64>, other: i64) -> serde_json::Value {
        let mut body = json!({"clientMsgId": uuid::Uuid::new_v4(), "body": BODY});
        let nth = |every: u64| every > 0 && n % every == every - 1;
        if let (true, Some(root)) = (nth(self.reply_every), root) {
            body["threadRootSeq"] = json!(root);
        }
        if nth(self.mention_every) {
            body["mentions"] = json!([other]);
        }
        body
    }
}

const BODY: &str = "a load-test message of a typical length, about sixty chars";

struct Phase {
    name: &'static str,
    sends: u64,
    /// Failed sends by their cause: the HTTP status ("429", "503") or "transport".
    errors: BTreeMap<String, u64>,
    elapsed: Duration,
    latency_us: Histogram<u64>,
    db: Delta,
    /// Cores each piece of the stack used during the phase.
    cpu: BTreeMap<&'static str, f64>,
}

impl Phase {
    fn error_count(&self) -> u64 {
        self.errors.values().sum()
    }

    /// "0 errors", or "12 errors (429: 12)".
    fn describe_errors(&self) -> String {
        if self.errors.is_empty() {
            return "0 errors".into();
        }
        let causes: Vec<String> = self
            .errors
            .iter()
            .map(|(k, n)| format!("{k}: {n}"))
            .collect();
        format!("{} errors ({})", self.error_count(), causes.join(", "))
    }

    fn per_second(&self) -> f64 {
        self.sends as f64 / self.elapsed.as_secs_f64()
    }

    fn json(&self, requested: Option<f64>) -> serde_json::Value {
        let q = |p: f64| self.latency_us.value_at_quantile(p) as f64 / 1000.0;
        json!({
            "phase": self.name, "sends": self.sends, "errors": self.error_count(), "errors_by_cause": self.errors,
            "seconds": self.elapsed.as_secs_f64(), "sends_per_second": self.per_second(),
            "requested_sends_per_second": requested,
            "latency_ms": {"p50": q(0.5), "p90": q(0.9), "p99": q(0.99), "max": self.latency_us.max() as f64 / 1000.0},
            "messages_inserted": self.db.table("message").inserted,
            "postgres": self.db.json(),
            "cpu_cores": self.cpu,
        })
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    anyhow::ensure!(args.repeat >= 1, "--repeat must be at least 1");
    anyhow::ensure!(
        args.generator == Generator::Rust || args.rate.is_none(),
        "--rate needs --generator rust (wrk runs a closed loop here)"
    );
    let mix = Mix::of(&args);
    anyhow::ensure!(
        args.generator == Generator::Rust || mix.is_none(),
        "--replies and --mentions need --generator rust"
    );
    let secret = std::fs::read_to_string(&args.secret_file)
        .with_context(|| format!("reading {}", args.secret_file))?;
    let keys = TokenKeys::new(&secret.trim().to_owned().into(), Duration::ZERO)?;
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(args.concurrency)
        .build()?;
    let mut stats = args.pg.connect().await?;
    let requested = match args.rate {
        Some(r) => format!("{r:.0}/s requested"),
        None => "closed loop, no rate requested".to_owned(),
    };

    let mut runs = Runs::default();
    let mut reports = Vec::new();
    for r in 0..args.repeat {
        // Fresh user ids per run so runs never share conversations.
        let base_user = 1_000_000 + (chatpipe_core::auth::unix_now() % 1_000_000) as i64 * 100;
        let users: Vec<i64> = (0..args.concurrency as i64)
            .map(|i| base_user + i)
            .collect();
        let tokens: Vec<String> = users
            .iter()
            .map(|&u| keys.issue(UserId::new(u).unwrap(), Duration::from_secs(3600)))
            .collect();
        eprintln!(
            "run {}: creating {} conversations of {} members…",
            r + 1,
            args.conversations,
            users.len()
        );
        // The senders take turns creating (conversation creation is rate-limited per
        // user: [rate_limits] creates); every sender is a member of every conversation.
        let create = |n: usize| {
            let creator = n % users.len();
            let others: Vec<i64> = users
                .iter()
                .copied()
                .filter(|&u| u != users[creator])
                .collect();
            create_group(&http, &args.base, &tokens[creator], others)
        };
        let mut plan: Vec<(&'static str, Vec<i64>, Option<Mix>)> = Vec::new();
        // With a mix, every other run sends it first: a drift over a run (the tables
        // grow, autovacuum, a checkpoint) weighs on both sides alike.
        let mix_first = mix.is_some() && r % 2 == 1;
        let kinds: &[(&str, &str, Option<Mix>)] = match mix {
            None => &[("spread", "hot", None)],
            Some(_) if mix_first => &[
                ("spread+threads", "hot+threads", mix),
                ("spread", "hot", None),
            ],
            Some(_) => &[
                ("spread", "hot", None),
                ("spread+threads", "hot+threads", mix),
            ],
        };
        for &(spread, hot, mix) in kinds {
            let mut conversations = Vec::with_capacity(args.conversations);
            for n in 0..args.conversations {
                conversations.push(create(n).await?);
            }
            plan.push((spread, conversations, mix));
            plan.push((hot, vec![create(args.conversations).await?], mix));
        }

        let mut phases = Vec::new();
        let people = (users.as_slice(), tokens.as_slice());
        for (name, convs, mix) in plan {
            let phase = run_phase(name, &args, &http, people, convs, (mix, &mut stats)).await?;
            let q = |x: f64| phase.latency_us.value_at_quantile(x) as f64 / 1000.0;
            println!(
                "run {} {:<7} {:>8.0} sends/s ({requested})  p50 {:>6.2} ms  p99 {:>6.2} ms  ({} sends, {}, {} senders); \
                 PostgreSQL: {} messages inserted, {} transactions, {} statements{}",
                r + 1,
                phase.name,
                phase.per_second(),
                q(0.5),
                q(0.99),
                phase.sends,
                phase.describe_errors(),
                args.concurrency,
                phase.db.table("message").inserted,
                phase.db.commits,
                phase.db.statement_calls(),
                phase.db.caveat(),
            );
            println!(
                "run {} {:<7} CPU in cores during the phase: {}",
                r + 1,
                phase.name,
                describe(&phase.cpu)
            );
            for (piece, cores) in &phase.cpu {
                runs.record(&format!("{name}.cpu.{piece}"), *cores);
            }
            runs.record(&format!("{name}.sends_per_s"), phase.per_second());
            runs.record(&format!("{name}.p50_ms"), q(0.5));
            runs.record(&format!("{name}.p99_ms"), q(0.99));
            runs.record(
                &format!("{name}.messages_inserted"),
                phase.db.table("message").inserted as f64,
            );
            runs.record(&format!("{name}.transactions"), phase.db.commits as f64);
            phases.push(phase);
        }
        // The plain phases first, whichever ran first.
        phases.sort_by_key(|p| p.name.contains("threads"));
        let ratio = phases[1].per_second() / phases[0].per_second();
        runs.record("hot_over_spread", ratio);
        println!("run {}: hot/spread throughput ratio {ratio:.2}", r + 1);
        if phases.len() == 4 {
            for (mixed, plain) in [(2, 0), (3, 1)] {
                let ratio = phases[mixed].per_second() / phases[plain].per_second();
                runs.record(&format!("{}_over_plain", phases[mixed].name), ratio);
                println!(
                    "run {}: {} / {} throughput ratio {ratio:.2} ({:.0}% replies, {:.0}% mentions; {} first)",
                    r + 1,
                    phases[mixed].name,
                    phases[plain].name,
                    args.replies * 100.0,
                    args.mentions * 100.0,
                    if mix_first { "threads" } else { "plain" }
                );
            }
        }
        let baseline = if args.no_baseline {
            serde_json::Value::Null
        } else {
            baseline(&args, r + 1, &phases, &mut runs).await?
        };
        reports.push(json!({
            "run": r + 1,
            "phases": phases.iter().map(|p| p.json(args.rate)).collect::<Vec<_>>(),
            "hot_over_spread": ratio,
            "baseline": baseline,
        }));
    }
    if args.repeat > 1 {
        runs.print();
    }
    let report = json!({
        "benchmark": "send-load",
        "machine": machine(),
        "args": {"concurrency": args.concurrency, "conversations": args.conversations, "seconds": args.seconds,
                 "base": args.base, "rate": args.rate, "repeat": args.repeat, "database": args.pg.database,
                 "replies": args.replies, "mentions": args.mentions},
        "runs": reports,
        "summary": runs.json(),
    });
    chatpipe_tests::bench::write_report(&args.out, &report)?;
    Ok(())
}

/// The design's send SQL run raw by pgbench right after the API's phases, on the same
/// server: the seed transaction spread and hot, and the same work as one statement
/// spread. Prints and records the API's throughput as ratios of them.
async fn baseline(
    args: &Args,
    run: usize,
    phases: &[Phase],
    runs: &mut Runs,
) -> anyhow::Result<serde_json::Value> {
    let mut bench = Pgbench::prepare(
        &args.pg.database_url,
        "target/bench/pgbench",
        args.baseline_clients,
    )
    .await?;
    let time = Duration::from_secs(args.seconds);
    let mut measured = Vec::new();
    for (name, script, conversations) in [
        ("seed_spread", Script::Seed, 10_000),
        ("seed_hot", Script::Seed, 1),
        ("one_statement_spread", Script::OneStatement, 10_000),
    ] {
        let m = bench.run(script, conversations, time).await?;
        println!(
            "run {run} baseline {name:<20} {:>8.0} tx/s; meanwhile {} checkpoints, CPU in cores: {}{}",
            m.tps,
            m.checkpoints,
            describe(&m.cpu),
            if m.waited_for_autovacuum > Duration::from_millis(500) {
                format!(" (waited {:.1} s for autovacuum first)", m.waited_for_autovacuum.as_secs_f64())
            } else {
                String::new()
            }
        );
        runs.record(&format!("baseline.{name}_tps"), m.tps);
        measured.push((name, m));
    }
    let (seed_spread, seed_hot, one_spread) =
        (measured[0].1.tps, measured[1].1.tps, measured[2].1.tps);
    let (spread, hot) = (phases[0].per_second(), phases[1].per_second());
    let ratios = [
        ("spread_over_seed", spread / seed_spread),
        ("spread_over_one_statement", spread / one_spread),
        ("hot_over_seed_hot", hot / seed_hot),
    ];
    println!(
        "run {run} baseline: the design's send SQL raw in pgbench ({} clients): seed {seed_spread:.0} tx/s spread, \
         {seed_hot:.0} hot; one statement {one_spread:.0} spread. The API: spread {:.2}x seed, {:.2}x one statement; \
         hot {:.2}x seed hot",
        bench.clients(),
        ratios[0].1,
        ratios[1].1,
        ratios[2].1,
    );
    for (name, ratio) in ratios {
        runs.record(name, ratio);
    }
    Ok(json!({
        "clients": bench.clients(),
        "seed_spread_tps": seed_spread, "seed_hot_tps": seed_hot,
        "one_statement_spread_tps": one_spread,
        "spread_over_seed": ratios[0].1, "spread_over_one_statement": ratios[1].1,
        "hot_over_seed_hot": ratios[2].1,
        "scripts": measured.iter().map(|(name, m)| (name.to_string(), m.json())).collect::<serde_json::Map<_, _>>(),
    }))
}

async fn create_group(
    http: &reqwest::Client,
    base: &str,
    token: &str,
    members: Vec<i64>,
) -> anyhow::Result<i64> {
    let res = http
        .post(format!("{base}/v1/conversations"))
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

/// Loads `conversations` for `--seconds`, checks them, and reads PostgreSQL's counts
/// before and after.
async fn run_phase(
    name: &'static str,
    args: &Args,
    http: &reqwest::Client,
    (users, tokens): (&[i64], &[String]),
    conversations: Vec<i64>,
    (mix, stats): (Option<Mix>, &mut PgStats),
) -> anyhow::Result<Phase> {
    // Like the baseline's scripts, no phase shares the machine with an autovacuum worker.
    stats.wait_for_autovacuum(Duration::from_secs(120)).await?;
    let before = args.pg.settled(stats).await?;
    if args.generator == Generator::Wrk {
        let cpu_before = CpuSample::now();
        let w = wrk::run(&args.base, tokens, &conversations, args.seconds).await?;
        let cpu = CpuSample::now().cores_since(&cpu_before);
        let after = args.pg.settled(stats).await?;
        check_stored(&args.pg, &conversations, w.sends, tokens.len() as u64).await?;
        return Ok(Phase {
            name,
            sends: w.sends,
            errors: w.errors,
            elapsed: w.elapsed,
            latency_us: w.latency_us,
            db: after.since(&before),
            cpu,
        });
    }
    let conversations = Arc::new(conversations);
    let cpu_before = CpuSample::now();
    let started = Instant::now();
    let deadline = started + Duration::from_secs(args.seconds);
    // Each sender's share of the requested rate.
    let period = args
        .rate
        .map(|r| Duration::from_secs_f64(tokens.len() as f64 / r));
    let mut workers = Vec::new();
    // Worker w sends to conversations w, w+C, w+2C, …: in the spread phase no two
    // workers contend for one row; in the hot phase all do.
    let step = tokens.len();
    for (w, token) in tokens.iter().enumerate() {
        let (http, token, base) = (http.clone(), token.clone(), args.base.clone());
        let conversations = conversations.clone();
        let mix = mix.unwrap_or_default();
        let other = users[(w + 1) % users.len()];
        workers.push(tokio::spawn(async move {
            let mut hist = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).unwrap();
            let mut seqs: HashMap<i64, Vec<i64>> = HashMap::new();
            let mut errors: BTreeMap<String, u64> = BTreeMap::new();
            let mut pace = period.map(|p| {
                let mut t = tokio::time::interval(p);
                t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                t
            });
            let mut i = w;
            while Instant::now() < deadline {
                if let Some(pace) = &mut pace {
                    pace.tick().await;
                }
                let conv = conversations[i % conversations.len()];
                i += step;
                let mine = seqs.get(&conv);
                let (n, root) = (mine.map_or(0, Vec::len) as u64, mine.map(|s| s[0]));
                // Offset by the sender, so that the senders, who fall into step in a
                // hot conversation, do not all reply in the same batch.
                let body = mix.body(n + w as u64, root, other);
                let t = Instant::now();
                let res = http
                    .post(format!("{base}/v1/conversations/{conv}/messages"))
                    .bearer_auth(&token)
                    .json(&body)
                    .send()
                    .await;
                let seq = match res {
                    Ok(r) if r.status() == 201 => r
                        .json::<serde_json::Value>()
                        .await
                        .ok()
                        .and_then(|v| v["seq"].as_i64())
                        .ok_or_else(|| "201 without a seq".to_owned()),
                    Ok(r) => Err(r.status().as_u16().to_string()),
                    Err(_) => Err("transport".to_owned()),
                };
                match seq {
                    Ok(seq) => {
                        hist.record(t.elapsed().as_micros() as u64).ok();
                        seqs.entry(conv).or_default().push(seq);
                    }
                    Err(cause) => *errors.entry(cause).or_default() += 1,
                }
            }
            (hist, seqs, errors)
        }));
    }
    let mut latency_us = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3)?;
    let mut returned: HashMap<i64, Vec<i64>> = HashMap::new();
    let mut errors: BTreeMap<String, u64> = BTreeMap::new();
    for w in workers {
        let (h, s, e) = w.await?;
        latency_us.add(h)?;
        for (cause, n) in e {
            *errors.entry(cause).or_default() += n;
        }
        for (conv, seqs) in s {
            returned.entry(conv).or_default().extend(seqs);
        }
    }
    let elapsed = started.elapsed();
    let cpu = CpuSample::now().cores_since(&cpu_before);
    let after = args.pg.settled(stats).await?;
    check_gapless(&args.pg, &returned).await?;
    let sends = returned.values().map(|s| s.len() as u64).sum();
    let phase = Phase {
        name,
        sends,
        errors,
        elapsed,
        latency_us,
        db: after.since(&before),
        cpu,
    };
    Ok(phase)
}

/// The invariant under load when the generator does not report seqs (wrk): every
/// conversation of the phase (each new before it) stores exactly the seqs 1..=last_seq,
/// and the messages stored are the sends answered 2xx plus at most one per connection:
/// wrk drops the requests in flight when its time is up, and the API commits them.
async fn check_stored(
    pg: &PgArgs,
    conversations: &[i64],
    sends: u64,
    connections: u64,
) -> anyhow::Result<()> {
    let mut db = sqlx::PgConnection::connect(&chatpipe_tests::with_database(
        &pg.database_url,
        &pg.database,
    ))
    .await?;
    let rows: Vec<(i64, i64, i64, i64, i64)> = sqlx::query_as(
        "SELECT c.id, c.last_seq, count(m.seq), coalesce(min(m.seq), 0), coalesce(max(m.seq), 0)
           FROM conversation c LEFT JOIN message m ON m.conversation_id = c.id
          WHERE c.id = ANY($1) GROUP BY c.id",
    )
    .bind(conversations)
    .fetch_all(&mut db)
    .await?;
    db.close().await?;
    let mut stored = 0;
    for (conv, last, count, min, max) in rows {
        if count != last || max != last || (count > 0 && min != 1) {
            bail!(
                "conversation {conv}: last_seq {last}, {count} messages stored, seqs {min}..={max}"
            );
        }
        stored += count as u64;
    }
    if stored < sends || stored > sends + connections {
        bail!("{sends} sends answered 2xx, {stored} messages stored, {connections} connections");
    }
    Ok(())
}

/// The invariant under load, for every conversation the phase wrote (each new before
/// it): the seqs its 201s returned are exactly 1..=n with no duplicate, its stored
/// `message` rows are exactly those seqs, and its last_seq is n.
async fn check_gapless(pg: &PgArgs, returned: &HashMap<i64, Vec<i64>>) -> anyhow::Result<()> {
    let ids: Vec<i64> = returned.keys().copied().collect();
    let mut db = sqlx::PgConnection::connect(&chatpipe_tests::with_database(
        &pg.database_url,
        &pg.database,
    ))
    .await?;
    let rows: Vec<(i64, i64)> =
        sqlx::query_as("SELECT conversation_id, seq FROM message WHERE conversation_id = ANY($1)")
            .bind(&ids)
            .fetch_all(&mut db)
            .await?;
    let last: HashMap<i64, i64> =
        sqlx::query_as("SELECT id, last_seq FROM conversation WHERE id = ANY($1)")
            .bind(&ids)
            .fetch_all(&mut db)
            .await?
            .into_iter()
            .collect();
    // Closed now, so its counts are flushed before the next phase's reading.
    db.close().await?;
    let mut stored: HashMap<i64, BTreeSet<i64>> = HashMap::new();
    for (conv, seq) in rows {
        stored.entry(conv).or_default().insert(seq);
    }
    for (conv, seqs) in returned {
        let n = seqs.len() as i64;
        let distinct: BTreeSet<i64> = seqs.iter().copied().collect();
        if distinct.len() != seqs.len() {
            bail!(
                "conversation {conv}: {} seqs returned twice",
                seqs.len() - distinct.len()
            );
        }
        let gapless: BTreeSet<i64> = (1..=n).collect();
        if distinct != gapless {
            let stray: Vec<_> = distinct.symmetric_difference(&gapless).take(10).collect();
            bail!("conversation {conv}: {n} sends returned seqs other than 1..={n}: {stray:?}");
        }
        let rows = stored.get(conv).cloned().unwrap_or_default();
        if rows != distinct {
            let stray: Vec<_> = rows.symmetric_difference(&distinct).take(10).collect();
            bail!(
                "conversation {conv}: {} stored messages differ from the {n} returned seqs: {stray:?}",
                rows.len()
            );
        }
        if last.get(conv) != Some(&n) {
            bail!(
                "conversation {conv}: last_seq {:?} but {n} sends succeeded",
                last.get(conv)
            );
        }
    }
    Ok(())
}
