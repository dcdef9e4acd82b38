//! Push latency and gateway memory on the real stack: REST commit -> Debezium ->
//! chat.events -> fanout -> chat.deliveries -> gateway -> WebSocket frame, with thousands
//! of connected clients. A measurement, not a test.
//!
//!   push-latency --connections 5000 --rate 200 --seconds 30
//!
//! Needs ingest-api, `pipeline fanout` and a gateway running on the stack (`scripts/demo`
//! leaves them up). It connects `--connections` users (one WebSocket each, `--per-address`
//! of them from each of the loopback addresses 127.1.0.1, 127.1.0.2, …, under the
//! gateway's bound per client address; past 4,096 connections start the gateway with
//! `GATEWAY_ENV=CHATPIPE_HTTP__MAX_CONNECTIONS=…`, and each process here may hold only
//! as many sockets as `ulimit -n` allows) and measures
//! the gateway's resident memory before and after: memory per idle connection. It then
//! sends at `--rate` messages/s for `--seconds`, mixed: 70% in direct chats, 25% in
//! groups of 10, 5% in groups of 300 (above the light threshold). For every frame it
//! notes commit (the 201) -> frame read by the client. The baseline, measured in the same
//! run, is commit -> the record on chat.events (the CDC leg every consumer pays): the
//! ratio says what fanout and the gateway add.
//!
//! Delivery is checked as sets of (user, conversation, seq): every member of a message's
//! conversation is online, so each must get exactly one frame. A missing frame or a frame
//! to a user who should not get it fails the run (non-zero exit, with a sample);
//! duplicates are counted and reported. Last, typing latency over the same connections
//! (`--typing-rounds`, 0 skips it): the first member of each small group types from a
//! socket of its own; typing frame sent -> read by each of the other nine. Rows and transactions are PostgreSQL's counts
//! (see `pgstats`, from `--database`), records are Kafka's (end offsets). `--repeat N`
//! runs the traffic phase N times over the same connections; the summary gives the
//! median and the spread of each figure.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use chatpipe_core::auth::TokenKeys;
use chatpipe_core::UserId;
use chatpipe_tests::bench::{
    create_direct, create_group, machine, records_on, send, start_event_reader, Arrivals, Runs,
};
use chatpipe_tests::cpu::{describe, CpuSample};
use chatpipe_tests::pgstats::PgArgs;
use clap::Parser;
use futures::StreamExt;
use hdrhistogram::Histogram;
use rand::Rng;
use serde_json::json;
use tokio_tungstenite::tungstenite::Message;

#[derive(Parser)]
struct Args {
    #[arg(long, default_value = "http://127.0.0.1:8080")]
    base: String,
    #[arg(long, default_value = "ws://127.0.0.1:8090/ws")]
    gateway: String,
    /// The gateway's /metrics (connection count).
    #[arg(long, default_value = "http://127.0.0.1:9091/metrics")]
    gateway_metrics: String,
    /// The fanout processor's /metrics (how many users it sees online).
    #[arg(long, default_value = "http://127.0.0.1:9102/metrics")]
    fanout_metrics: String,
    /// The gateway's pid (default: the process named `gateway`).
    #[arg(long)]
    gateway_pid: Option<u32>,
    #[arg(long, default_value = ".stack/jwt-secret")]
    secret_file: String,
    #[command(flatten)]
    stack: chatpipe_tests::bench::StackArgs,
    #[command(flatten)]
    pg: PgArgs,
    #[arg(long, default_value = "chat.events")]
    topic: String,
    /// Where fanout writes its per-gateway lists (records counted from its offsets).
    #[arg(long, default_value = "chat.deliveries")]
    deliveries_topic: String,
    #[arg(long, default_value_t = 5000)]
    connections: usize,
    /// The first user id (default: one derived from the clock). Processes run side by
    /// side (scripts/bench-push) each get their own range.
    #[arg(long)]
    first_user: Option<i64>,
    /// Start the first traffic run at this wall-clock time (seconds since the epoch), so
    /// that processes run side by side (scripts/bench-push) send at the same time, after
    /// all of them connected and set up.
    #[arg(long)]
    traffic_at: Option<u64>,
    /// Connections from each client address (127.1.0.1, 127.1.0.2, …); under the
    /// gateway's `http.max_connections_per_ip` (256).
    #[arg(long, default_value_t = 200)]
    per_address: usize,
    #[arg(long, default_value_t = 200)]
    rate: u64,
    #[arg(long, default_value_t = 30)]
    seconds: u64,
    /// Runs of the traffic phase over the same connections and conversations; the
    /// summary gives median and spread.
    #[arg(long, default_value_t = 1)]
    repeat: usize,
    /// Rounds of the typing phase (0: none): in each, the first member of every small
    /// group sends one typing frame from a socket of its own, 3.2 s apart (fanout passes
    /// one per 3 s), and the other nine members' frames are timed.
    #[arg(long, default_value_t = 5)]
    typing_rounds: usize,
    #[arg(long, default_value = "target/bench/push-latency.json")]
    out: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Kind {
    Direct,
    SmallGroup,
    LargeGroup,
}

struct Conversation {
    id: i64,
    kind: Kind,
    members: Vec<i64>,
}

/// Every frame the clients read: (user, conversation, seq, when).
type Frames = Arc<Mutex<Vec<(i64, i64, i64, Instant)>>>;
/// Every typing frame the clients read: (user, conversation, when).
type Typings = Arc<Mutex<Vec<(i64, i64, Instant)>>>;
/// Every message sent: (conversation, seq) -> (its 201, index of its conversation).
type Sent = Arc<Mutex<HashMap<(i64, i64), (Instant, usize)>>>;
/// (user, conversation, seq): one frame a user should get, or got.
type Delivery = (i64, i64, i64);

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let secret =
        std::fs::read_to_string(&args.secret_file).with_context(|| args.secret_file.clone())?;
    let keys = TokenKeys::new(&secret.trim().to_owned().into(), Duration::ZERO)?;
    let token = |u: i64| keys.issue(UserId::new(u).unwrap(), Duration::from_secs(3600));
    let http = reqwest::Client::new();
    let pid = match args.gateway_pid {
        Some(pid) => pid,
        None => find_pid("gateway")?,
    };
    let first = args
        .first_user
        .unwrap_or(3_000_000 + (chatpipe_core::auth::unix_now() % 1_000_000) as i64 * 10);
    let users: Vec<i64> = (first..first + args.connections as i64).collect();

    // Idle memory: RSS before and after every user connects.
    let rss_before = rss_kib(pid)?;
    let connections_before = gauge(&http, &args.gateway_metrics, "gateway_connections").await?;
    let frames: Frames = Arc::default();
    let typings: Typings = Arc::default();
    let started = Instant::now();
    let clients: Vec<_> = futures::stream::iter(users.iter().enumerate().map(|(i, u)| {
        let (url, token, frames) = (args.gateway.clone(), token(*u), frames.clone());
        let typings = typings.clone();
        let (user, source) = (*u, source_address(i, args.per_address));
        async move { connect(&url, &token, source, user, frames, typings).await }
    }))
    .buffer_unordered(200)
    .collect::<Vec<_>>()
    .await
    .into_iter()
    .collect::<anyhow::Result<_>>()?;
    let connect_s = started.elapsed().as_secs_f64();
    let want = connections_before + args.connections as f64;
    poll(Duration::from_secs(30), || async {
        Ok(gauge(&http, &args.gateway_metrics, "gateway_connections").await? >= want)
    })
    .await
    .context("the gateway never counted every connection")?;
    let rss_idle = rss_kib(pid)?;
    let per_connection_kib = (rss_idle - rss_before) as f64 / args.connections as f64;
    println!(
        "{} connections in {connect_s:.1} s; gateway RSS {:.1} MiB -> {:.1} MiB: {per_connection_kib:.1} KiB per idle connection",
        args.connections,
        rss_before as f64 / 1024.0,
        rss_idle as f64 / 1024.0
    );
    poll(Duration::from_secs(60), || async {
        Ok(
            gauge(&http, &args.fanout_metrics, "fanout_presence_online").await?
                >= args.connections as f64,
        )
    })
    .await
    .context("the fanout processor never saw every user online (is `pipeline fanout` running?)")?;

    // Conversations among the connected users.
    let mut conversations = Vec::new();
    for pair in users.chunks_exact(2).take(1000) {
        let id = create_direct(&http, &args.base, &token(pair[0]), pair[1]).await?;
        conversations.push(Conversation {
            id,
            kind: Kind::Direct,
            members: pair.to_vec(),
        });
    }
    for (size, count, kind) in [(10, 100, Kind::SmallGroup), (300, 4, Kind::LargeGroup)] {
        for i in 0..count {
            // Each group has another creator: one user adding all four groups of 300
            // (the first member of each, when every group started at user 0) passed the
            // per-user limit on users added to groups (rate_limits.members_added, burst 1,000): 429.
            let start = (i * (size + 7)) % (users.len() - size);
            let members = users[start..start + size].to_vec();
            let id = create_group(&http, &args.base, &token(members[0]), &members[1..]).await?;
            conversations.push(Conversation { id, kind, members });
        }
    }
    let by_kind = |k: Kind| -> Vec<usize> {
        (0..conversations.len())
            .filter(|i| conversations[*i].kind == k)
            .collect()
    };
    let (directs, smalls, larges) = (
        by_kind(Kind::Direct),
        by_kind(Kind::SmallGroup),
        by_kind(Kind::LargeGroup),
    );

    let ctx = Ctx {
        args: &args,
        http: &http,
        keys: &keys,
        conversations: Arc::new(conversations),
        kinds: [directs, smalls, larges],
        frames: frames.clone(),
    };
    let mut stats = args.pg.connect().await?;
    let mut runs = Runs::default();
    let mut reports = Vec::new();
    let mut earlier: HashSet<Delivery> = HashSet::new();
    let mut failures = Vec::new();
    if let Some(at) = args.traffic_at {
        let now = chatpipe_core::auth::unix_now();
        anyhow::ensure!(
            now <= at,
            "set up {} s after --traffic-at: give the processes more time",
            now - at
        );
        tokio::time::sleep(Duration::from_secs(at - now)).await;
    }
    for run in 1..=args.repeat {
        let outcome = traffic(&ctx, run, &mut stats, &mut earlier, &mut runs).await?;
        if let Some(failure) = outcome.failure {
            failures.push(format!("run {run}: {failure}"));
        }
        reports.push(outcome.report);
    }
    let typing = if args.typing_rounds > 0 {
        typing_phase(&ctx, &typings, &mut runs).await?
    } else {
        json!(null)
    };
    let rss_after = rss_kib(pid)?;
    println!(
        "gateway RSS after traffic: {:.1} MiB",
        rss_after as f64 / 1024.0
    );
    if args.repeat > 1 {
        runs.print();
    }
    let report = json!({
        "benchmark": "push-latency",
        "machine": machine(),
        "connections": args.connections,
        "connect_s": connect_s,
        "gateway_rss_kib": {"before": rss_before, "idle": rss_idle, "after_traffic": rss_after},
        "kib_per_idle_connection": per_connection_kib,
        "rate": args.rate,
        "runs": reports,
        "typing": typing,
        "summary": runs.json(),
    });
    chatpipe_tests::bench::write_report(&args.out, &report)?;
    drop(clients);
    if !failures.is_empty() {
        bail!("delivery failed: {}", failures.join("; "));
    }
    Ok(())
}

/// What every traffic run shares: the connected users' conversations and their frames.
struct Ctx<'a> {
    args: &'a Args,
    http: &'a reqwest::Client,
    keys: &'a TokenKeys,
    conversations: Arc<Vec<Conversation>>,
    /// Indexes of the direct chats, the small groups and the large groups.
    kinds: [Vec<usize>; 3],
    frames: Frames,
}

struct Outcome {
    report: serde_json::Value,
    /// Lost frames or frames to the wrong user, in words.
    failure: Option<String>,
}

/// One traffic run: `--seconds` of sends at `--rate`, then every expected frame waited
/// for and the run's figures printed and recorded. `earlier` holds the deliveries of the
/// runs before: a late repeat of one counts as a duplicate, not as a wrong user.
async fn traffic(
    ctx: &Ctx<'_>,
    run: usize,
    stats: &mut chatpipe_tests::pgstats::PgStats,
    earlier: &mut HashSet<Delivery>,
    runs: &mut Runs,
) -> anyhow::Result<Outcome> {
    let (args, http, conversations, frames) = (ctx.args, ctx.http, &ctx.conversations, &ctx.frames);
    let token = |u: i64| {
        ctx.keys
            .issue(UserId::new(u).unwrap(), Duration::from_secs(3600))
    };
    let [directs, smalls, larges] = &ctx.kinds;
    let first_frame = frames.lock().unwrap().len();
    // Traffic, and the baseline reader of chat.events.
    let arrivals = Arrivals::default();
    let reader = start_event_reader(
        &args.stack.brokers,
        &args.stack.registry,
        &args.topic,
        arrivals.clone(),
    )
    .await?;
    let before = args.pg.settled(stats).await?;
    let offsets = || -> anyhow::Result<(i64, i64)> {
        tokio::task::block_in_place(|| {
            Ok((
                records_on(&args.stack.brokers, &args.topic)?,
                records_on(&args.stack.brokers, &args.deliveries_topic)?,
            ))
        })
    };
    let (events_before, deliveries_before) = offsets()?;
    let sent: Sent = Arc::default();
    let total = args.rate * args.seconds;
    let mut ticker = tokio::time::interval(Duration::from_micros(1_000_000 / args.rate));
    let limit = Arc::new(tokio::sync::Semaphore::new(64));
    let mut tasks = Vec::new();
    let mut rng = rand::rng();
    let sending = Instant::now();
    let cpu_before = CpuSample::now();
    for _ in 0..total {
        ticker.tick().await;
        let roll: f64 = rng.random();
        let pool = if roll < 0.70 {
            directs
        } else if roll < 0.95 {
            smalls
        } else {
            larges
        };
        let i = pool[rng.random_range(0..pool.len())];
        let sender = conversations[i].members[rng.random_range(0..conversations[i].members.len())];
        let (http, base, token, sent, convs, permit) = (
            http.clone(),
            args.base.clone(),
            token(sender),
            sent.clone(),
            conversations.clone(),
            limit.clone().acquire_owned().await?,
        );
        tasks.push(tokio::spawn(async move {
            let _permit = permit;
            let (seq, at) = send(&http, &base, &token, convs[i].id).await?;
            sent.lock().unwrap().insert((convs[i].id, seq), (at, i));
            anyhow::Ok(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    // From the first tick to the last 201.
    let sending_s = sending.elapsed().as_secs_f64();

    // Expected: every member of each message's conversation (all of them are connected,
    // and fanout pushes to the sender's devices too), once.
    let expected: HashSet<Delivery> = sent
        .lock()
        .unwrap()
        .iter()
        .flat_map(|(&(conv, seq), &(_, i))| {
            conversations[i]
                .members
                .iter()
                .map(move |&user| (user, conv, seq))
        })
        .collect();
    // Waits for each expected frame, looking only at frames read since the last look.
    let mut waiting = expected.clone();
    let mut looked = first_frame;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        {
            let frames = frames.lock().unwrap();
            for &(user, conv, seq, _) in &frames[looked..] {
                waiting.remove(&(user, conv, seq));
            }
            looked = frames.len();
        }
        if waiting.is_empty() || Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // From the first send until every frame arrived (or the wait gave up).
    let (cpu, pushing_s) = (
        CpuSample::now().cores_since(&cpu_before),
        sending.elapsed().as_secs_f64(),
    );
    let all_arrived = waiting.is_empty();
    if !all_arrived {
        println!(
            "{} expected frames still missing 30 s after the last send",
            waiting.len()
        );
    }
    reader.abort();
    let (events_after, deliveries_after) = offsets()?;
    let db = args.pg.settled(stats).await?.since(&before);

    // Results: the first frame of each (user, conversation, seq) counts; any further one
    // is a duplicate.
    let arrivals = arrivals.lock().await.clone();
    let sent = sent.lock().unwrap();
    let frames = frames.lock().unwrap();
    let mut received: HashSet<Delivery> = HashSet::new();
    let mut duplicates = 0usize;
    let mut push: HashMap<Option<Kind>, Histogram<u64>> = HashMap::new();
    for &(user, conv, seq, at) in &frames[first_frame..] {
        if earlier.contains(&(user, conv, seq)) || !received.insert((user, conv, seq)) {
            duplicates += 1;
            continue;
        }
        if !expected.contains(&(user, conv, seq)) {
            continue;
        }
        let (committed, i) = sent[&(conv, seq)];
        let micros = at.saturating_duration_since(committed).as_micros().max(1) as u64;
        for key in [None, Some(conversations[i].kind)] {
            push.entry(key)
                .or_insert_with(|| Histogram::new_with_bounds(1, 600_000_000, 3).unwrap())
                .record(micros)?;
        }
    }
    let mut lost: Vec<Delivery> = expected.difference(&received).copied().collect();
    let mut wrong: Vec<Delivery> = received.difference(&expected).copied().collect();
    lost.sort_unstable();
    wrong.sort_unstable();
    let mut topic = Histogram::<u64>::new_with_bounds(1, 600_000_000, 3)?;
    for (key, (committed, _)) in sent.iter() {
        if let Some(at) = arrivals.get(key) {
            topic.record(at.saturating_duration_since(*committed).as_micros().max(1) as u64)?;
        }
    }
    let ms = |h: &Histogram<u64>, q: f64| h.value_at_quantile(q) as f64 / 1000.0;
    let empty = Histogram::<u64>::new_with_bounds(1, 600_000_000, 3)?;
    let all = push.get(&None).unwrap_or(&empty);
    let achieved = sent.len() as f64 / sending_s;
    println!(
        "run {run}: {} messages in {sending_s:.1} s: {achieved:.1} msg/s achieved, {} msg/s requested",
        sent.len(),
        args.rate,
    );
    println!(
        "frames (user, conversation, seq): {} expected, {} received, {} lost, {} to the wrong user, {} duplicates",
        expected.len(),
        received.len() - wrong.len(),
        lost.len(),
        wrong.len(),
        duplicates
    );
    println!(
        "Kafka: {} records appended to {}, {} to {} (offsets, anyone's); PostgreSQL: {} messages inserted, {} transactions{}",
        events_after - events_before,
        args.topic,
        deliveries_after - deliveries_before,
        args.deliveries_topic,
        db.table("message").inserted,
        db.commits,
        db.caveat(),
    );
    println!(
        "baseline  commit -> chat.events:      p50 {:6.1} ms  p99 {:6.1} ms  ({} records)",
        ms(&topic, 0.5),
        ms(&topic, 0.99),
        topic.len()
    );
    println!(
        "push      commit -> WebSocket frame:  p50 {:6.1} ms  p99 {:6.1} ms  ({} frames)",
        ms(all, 0.5),
        ms(all, 0.99),
        all.len()
    );
    for kind in [Kind::Direct, Kind::SmallGroup, Kind::LargeGroup] {
        if let Some(h) = push.get(&Some(kind)) {
            println!(
                "  {kind:?}: p50 {:6.1} ms  p99 {:6.1} ms  ({} frames)",
                ms(h, 0.5),
                ms(h, 0.99),
                h.len()
            );
        }
    }
    println!(
        "ratio push/baseline: p50 {:.2}x  p99 {:.2}x  (fanout + gateway add {:.1} ms at p50)",
        ms(all, 0.5) / ms(&topic, 0.5),
        ms(all, 0.99) / ms(&topic, 0.99),
        ms(all, 0.5) - ms(&topic, 0.5)
    );
    let frames_received = (received.len() - wrong.len()) as f64;
    let push_cores = ["fanout", "gateway"]
        .iter()
        .map(|p| cpu.get(p).copied().unwrap_or(0.0))
        .sum::<f64>();
    let per_core = frames_received / pushing_s / push_cores;
    println!(
        "CPU in cores from the first send to the last frame ({pushing_s:.1} s): {}; \
         {per_core:.0} frames/s per core of fanout + gateway",
        describe(&cpu)
    );
    let sample = |v: &[Delivery]| v.iter().take(10).copied().collect::<Vec<_>>();
    for (name, value) in [
        ("achieved_msg_per_s", achieved),
        ("baseline_p50_ms", ms(&topic, 0.5)),
        ("baseline_p99_ms", ms(&topic, 0.99)),
        ("push_p50_ms", ms(all, 0.5)),
        ("push_p99_ms", ms(all, 0.99)),
        ("ratio_p50", ms(all, 0.5) / ms(&topic, 0.5)),
        ("ratio_p99", ms(all, 0.99) / ms(&topic, 0.99)),
        ("frames", frames_received),
        ("frames_per_s_per_push_core", per_core),
        ("lost", lost.len() as f64),
        ("duplicates", duplicates as f64),
    ] {
        runs.record(name, value);
    }
    let report = json!({
        "run": run,
        "messages": sent.len(), "rate": args.rate, "achieved_rate": achieved, "sending_s": sending_s,
        "frames": {
            "expected": expected.len(), "received": received.len() - wrong.len(),
            "lost": lost.len(), "wrong_user": wrong.len(), "duplicates": duplicates,
            "all_arrived_within_30s_of_last_send": all_arrived,
            "lost_sample": sample(&lost), "wrong_user_sample": sample(&wrong),
        },
        "kafka_records": {"events": events_after - events_before, "deliveries": deliveries_after - deliveries_before},
        "postgres": db.json(),
        "baseline_commit_to_topic_ms": {"p50": ms(&topic, 0.5), "p99": ms(&topic, 0.99)},
        "push_commit_to_frame_ms": {"p50": ms(all, 0.5), "p99": ms(all, 0.99), "max": all.max() as f64 / 1000.0},
        "ratio_p50": ms(all, 0.5) / ms(&topic, 0.5),
        "ratio_p99": ms(all, 0.99) / ms(&topic, 0.99),
        "cpu_cores": cpu, "pushing_s": pushing_s, "frames_per_s_per_push_core": per_core,
    });
    let failure = (!lost.is_empty() || !wrong.is_empty()).then(|| {
        format!(
            "{} lost, e.g. (user, conversation, seq) {:?}; {} to the wrong user, e.g. {:?}",
            lost.len(),
            sample(&lost),
            wrong.len(),
            sample(&wrong)
        )
    });
    earlier.extend(expected);
    Ok(Outcome { report, failure })
}

/// The loopback address the `i`-th connection comes from: `per_address` connections
/// from each of 127.1.0.1, 127.1.0.2, … (Linux answers for all of 127.0.0.0/8), under
/// the gateway's bound per client address, as users behind many addresses would be.
fn source_address(i: usize, per_address: usize) -> std::net::IpAddr {
    let k = i / per_address.max(1);
    std::net::Ipv4Addr::new(127, 1, (k / 250) as u8, (k % 250 + 1) as u8).into()
}

/// Connects `user`'s client, whose task notes every message.new frame it reads.
async fn connect(
    url: &str,
    token: &str,
    source: std::net::IpAddr,
    user: i64,
    frames: Frames,
    typings: Typings,
) -> anyhow::Result<tokio::task::JoinHandle<()>> {
    let mut ws = gateway::client::connect_from(url, token, source)
        .await
        .with_context(|| format!("connecting to {url} from {source}"))?;
    Ok(tokio::spawn(async move {
        while let Some(Ok(frame)) = ws.next().await {
            if let Message::Text(text) = frame {
                let at = Instant::now();
                let v: serde_json::Value = match serde_json::from_str(&text) {
                    Ok(v) => v,
                    Err(_) => continue,
                };
                if v["type"] == "typing" {
                    if let Some(c) = v["conversationId"].as_i64() {
                        typings.lock().unwrap().push((user, c, at));
                    }
                }
                if v["type"] == "message.new" {
                    if let (Some(c), Some(s)) = (v["conversationId"].as_i64(), v["seq"].as_i64()) {
                        frames.lock().unwrap().push((user, c, s, at));
                    }
                }
            }
        }
    }))
}

/// Typing latency: frame sent by the typer's socket -> frame read by each other member,
/// over the small groups (10 members, all online), `--typing-rounds` rounds 3.2 s apart.
async fn typing_phase(
    ctx: &Ctx<'_>,
    typings: &Typings,
    runs: &mut Runs,
) -> anyhow::Result<serde_json::Value> {
    use futures::SinkExt;
    let args = ctx.args;
    let groups: Vec<&Conversation> = ctx.kinds[1]
        .iter()
        .map(|&i| &ctx.conversations[i])
        .collect();
    let mut typers = Vec::new();
    for g in &groups {
        let token = ctx
            .keys
            .issue(UserId::new(g.members[0])?, Duration::from_secs(3600));
        typers.push(gateway::client::connect(&args.gateway, &token).await?);
    }
    typings.lock().unwrap().clear();
    // (conversation, round) -> when its frame was sent.
    let mut sent: HashMap<(i64, usize), Instant> = HashMap::new();
    for round in 0..args.typing_rounds {
        for (g, ws) in groups.iter().zip(typers.iter_mut()) {
            let frame = json!({"type": "typing", "conversationId": g.id}).to_string();
            sent.insert((g.id, round), Instant::now());
            ws.send(Message::Text(frame.into())).await?;
        }
        // Pacing, not waiting for a condition: fanout passes one per 3 s per typer.
        tokio::time::sleep(Duration::from_millis(3200)).await;
    }
    let expected: usize =
        groups.iter().map(|g| g.members.len() - 1).sum::<usize>() * args.typing_rounds;
    let _ = poll(Duration::from_secs(10), || async {
        Ok(typings.lock().unwrap().len() >= expected)
    })
    .await;
    // A member's k-th typing frame of a conversation answers round k.
    let mut arrivals: HashMap<(i64, i64), Vec<Instant>> = HashMap::new();
    for &(user, conv, at) in typings.lock().unwrap().iter() {
        arrivals.entry((user, conv)).or_default().push(at);
    }
    let mut latency = Histogram::<u64>::new(3)?;
    let mut wrong = 0;
    for ((user, conv), mut ats) in arrivals {
        let g = groups.iter().find(|g| g.id == conv);
        if g.is_none_or(|g| !g.members.contains(&user) || g.members[0] == user) {
            wrong += ats.len();
            continue;
        }
        ats.sort();
        for (round, at) in ats.into_iter().enumerate() {
            if let Some(t) = sent.get(&(conv, round)) {
                latency.record(at.saturating_duration_since(*t).as_micros() as u64)?;
            }
        }
    }
    let got = latency.len() as usize;
    let ms = |q: f64| latency.value_at_quantile(q) as f64 / 1000.0;
    println!(
        "typing: {} connections, {} groups of 10, {} rounds: {got} frames of {expected} expected \
         ({wrong} to a user who should not get one); sent -> read p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
        args.connections,
        groups.len(),
        args.typing_rounds,
        ms(0.5),
        ms(0.99),
        latency.max() as f64 / 1000.0
    );
    runs.record("typing.p50_ms", ms(0.5));
    runs.record("typing.p99_ms", ms(0.99));
    anyhow::ensure!(
        wrong == 0,
        "{wrong} typing frames to users who should not get one"
    );
    Ok(json!({
        "groups": groups.len(), "rounds": args.typing_rounds, "expected": expected,
        "received": got, "p50_ms": ms(0.5), "p90_ms": ms(0.9), "p99_ms": ms(0.99),
        "max_ms": latency.max() as f64 / 1000.0,
    }))
}

async fn poll<F, Fut>(limit: Duration, mut done: F) -> anyhow::Result<()>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<bool>>,
{
    let deadline = Instant::now() + limit;
    loop {
        if done().await? {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("not done after {limit:?}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A gauge's value from a Prometheus text page (0 when absent).
async fn gauge(http: &reqwest::Client, url: &str, name: &str) -> anyhow::Result<f64> {
    let page = http
        .get(url)
        .send()
        .await
        .with_context(|| format!("reading {url}"))?
        .text()
        .await?;
    Ok(chatpipe_tests::metric_sum(&page, name, &[]).unwrap_or(0.0))
}

fn rss_kib(pid: u32) -> anyhow::Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("reading /proc/{pid}/status"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .context("VmRSS")
}

fn find_pid(name: &str) -> anyhow::Result<u32> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc")? {
        let entry = entry?;
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        if std::fs::read_to_string(entry.path().join("comm")).is_ok_and(|c| c.trim() == name) {
            found.push(pid);
        }
    }
    match found.as_slice() {
        [pid] => Ok(*pid),
        [] => bail!("no process named {name}: start the gateway, or pass --gateway-pid"),
        _ => bail!("several processes named {name} ({found:?}): pass --gateway-pid"),
    }
}
