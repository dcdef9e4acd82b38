//! Read storm: a 1,000-member group and 10,000 1:1 conversations whose members send many
//! receipts within seconds, as real `POST /conversations/{id}/read` requests to an
//! ingest-api started in this process. The stream path (stream mode: the route asks
//! PostgreSQL nothing, the receipt goes to Kafka and the receipts processor applies it in
//! batched UPDATEs that check membership and clamp) against the original design's path
//! (direct mode: one guarded UPDATE per receipt, the baseline). Both paths pay the
//! route's own per-receipt work (HTTP, the token, the rate limit). A measurement, not a
//! test.
//!
//!   eval "$(scripts/stack env)"; target/release/read-storm [--receipts 100000] [--repeat 3]
//!
//! `--acks` storms delivery acks instead (`POST /conversations/{id}/delivered`,
//! `chat.delivery-acks`, `last_delivered_seq`, `delivery.updated`): the ack storm of
//! issue 15 is `--acks --directs 0` (1,000 members, 100 acks each). It also prints how
//! long after the last answer every watermark was final.
//!
//! Each phase gets a fresh database seeded the same way, and the order of the two phases
//! alternates between runs. A phase ends when every request was answered, every receipt
//! on the topic was consumed (the receipts group's committed offsets reach the end of
//! every partition) and every watermark is final. Statements, transactions and rows are
//! PostgreSQL's counts (pg_stat_statements, pg_stat_database, pg_stat_user_tables);
//! records are Kafka's (offsets).

use chatpipe_core::kafka::CreateGuarded;
use std::collections::HashMap;
use std::time::{Duration, Instant};

use anyhow::Context;
use chatpipe_core::auth::TokenKeys;
use chatpipe_core::UserId;
use chatpipe_tests::bench::{machine, records_on, GroupProgress, Runs};
use chatpipe_tests::pgstats::{Delta, PgStats};
use clap::Parser;
use futures::StreamExt;
use ingest_api::configuration::{ReadMode, Settings};
use ingest_api::startup::Application;
use rand::{Rng, SeedableRng};
use secrecy::SecretString;
use serde_json::json;
use sqlx::{Connection, Executor, PgConnection};

#[derive(Parser)]
struct Args {
    #[arg(long, default_value_t = 100_000)]
    receipts: usize,
    #[arg(long, default_value_t = 1000)]
    group_members: i64,
    #[arg(long, default_value_t = 10_000)]
    directs: i64,
    /// Requests in flight at once, in both phases (the API has its configured 16
    /// PostgreSQL connections).
    #[arg(long, default_value_t = 64)]
    concurrency: usize,
    /// Runs; the phase order alternates, and the summary gives median and spread.
    #[arg(long, default_value_t = 1)]
    repeat: usize,
    #[arg(
        long,
        env = "DATABASE_URL",
        default_value = "postgres://postgres:postgres@127.0.0.1:5432/postgres"
    )]
    database_url: String,
    #[command(flatten)]
    stack: chatpipe_tests::bench::StackArgs,
    /// Delivery acks instead of reads.
    #[arg(long)]
    acks: bool,
    #[arg(long, default_value = "target/bench/read-storm.json")]
    out: String,
}

/// What the storm moves: the route, the topic, the watermark column and its event.
struct Storm {
    route: &'static str,
    /// How the statements that move the watermarks start (pg_stat_statements' text):
    /// the flush's or direct mode's own, and direct mode's call of a function holding
    /// its UPDATE (counted as the call), if any.
    update: [&'static str; 2],
    topic: &'static str,
    column: &'static str,
    event: &'static str,
}

impl Args {
    fn storm(&self) -> Storm {
        if self.acks {
            Storm {
                route: "delivered",
                // chatpipe_core::watermark::deliver: the UPDATE in a CTE.
                update: ["WITH b AS (", "-"],
                topic: "chat.delivery-acks",
                column: "last_delivered_seq",
                event: "delivery.updated",
            }
        } else {
            Storm {
                route: "read",
                // The flush's call of chat_advance_reads (chatpipe_core::watermark::
                // advance), and direct mode's of chat_mark_read; both hold the UPDATE.
                update: [
                    "SELECT conversation_id, user_id, last_read_seq FROM chat_advance_reads",
                    "SELECT last_read_seq, advanced FROM chat_mark_read",
                ],
                topic: "chat.read-receipts",
                column: "last_read_seq",
                event: "read.updated",
            }
        }
    }
}

const LAST_SEQ: i64 = 100;
/// The in-process API's secret: its tokens are issued here and nowhere else.
const JWT_SECRET: &str = "read-storm-secret-read-storm-secret!";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Path {
    /// Stream mode: receipts to Kafka, batched UPDATEs by the receipts processor.
    Stream,
    /// Direct mode: one guarded UPDATE (and outbox row when it moved) per receipt.
    Baseline,
}

impl Path {
    fn name(self) -> &'static str {
        match self {
            Path::Stream => "stream",
            Path::Baseline => "baseline",
        }
    }
}

/// What one phase measured. Every count comes from PostgreSQL or Kafka.
struct Phase {
    path: Path,
    /// The storm's watermark statements ([`Storm::update`]).
    update: [&'static str; 2],
    /// Every request answered.
    answered: Duration,
    /// Every receipt consumed and every watermark final.
    converged: Duration,
    db: Delta,
    read_updated_events: i64,
    records_produced: i64,
    records_consumed: i64,
    /// The stream phase's [`http_ceiling`], requests/s.
    ceiling: Option<f64>,
}

impl Phase {
    /// From the last answer until every watermark was final.
    fn settled(&self) -> Duration {
        self.converged.saturating_sub(self.answered)
    }

    fn update_statements(&self) -> i64 {
        self.update.iter().map(|u| self.db.calls(u)).sum()
    }

    fn rows_updated(&self) -> i64 {
        self.db.table("conversation_member").updated
    }

    /// The route's per-receipt read in stream mode (`store::as_member`).
    fn member_reads(&self) -> i64 {
        self.db
            .calls("SELECT c.type, c.member_count, c.last_seq, m.last_read_seq")
    }

    fn json(&self, receipts: f64) -> serde_json::Value {
        json!({
            "answered_s": self.answered.as_secs_f64(),
            "requests_per_s": receipts / self.answered.as_secs_f64(),
            "converged_s": self.converged.as_secs_f64(),
            "final_after_last_answer_s": self.settled().as_secs_f64(),
            "receipts_per_s": receipts / self.converged.as_secs_f64(),
            "update_statements": self.update_statements(),
            "watermark_rows_updated": self.rows_updated(),
            "receipts_per_updated_row": receipts / self.rows_updated().max(1) as f64,
            "member_reads": self.member_reads(),
            "transactions": self.db.commits,
            // Direct mode rolls back the transaction of a receipt that moved nothing.
            "transactions_rolled_back": self.db.rollbacks,
            "read_updated_events": self.read_updated_events,
            "kafka_records_produced": self.records_produced,
            "kafka_records_consumed": self.records_consumed,
            "http_ceiling_requests_per_s": self.ceiling,
            "postgres": self.db.json(),
        })
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    anyhow::ensure!(args.repeat >= 1, "--repeat must be at least 1");
    chatpipe_core::telemetry::init_logging();
    let run = format!("storm{}", chatpipe_core::auth::unix_now());
    let keys = TokenKeys::new(&SecretString::from(JWT_SECRET), Duration::ZERO)?;
    let members = args.group_members + 2 * args.directs;

    // The storm: receipts from random members (an index into the members, ordered, of
    // each phase's identically seeded database), mostly moving forwards, some stale,
    // some past the end (clamped).
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let storm: Vec<(usize, i64)> = (0..args.receipts)
        .map(|_| {
            let member = rng.random_range(0..members as usize);
            (member, rng.random_range(1..=LAST_SEQ + 20))
        })
        .collect();

    let n = args.receipts as f64;
    let mut runs = Runs::default();
    let mut reports = Vec::new();
    for r in 0..args.repeat {
        let order = if r % 2 == 0 {
            [Path::Stream, Path::Baseline]
        } else {
            [Path::Baseline, Path::Stream]
        };
        let mut phases = Vec::new();
        for path in order {
            let db = format!("{run}_{r}_{}", path.name());
            let p = phase(&args, &db, path, &storm, &keys).await?;
            print_phase(&p, &args, r);
            phases.push(p);
        }
        let find = |path| phases.iter().find(|p| p.path == path).expect("both ran");
        let (stream, baseline) = (find(Path::Stream), find(Path::Baseline));
        let speedup = baseline.converged.as_secs_f64() / stream.converged.as_secs_f64();
        println!(
            "run {}: every watermark final after {:.2} s (stream) vs {:.2} s (baseline): \
             stream speedup {speedup:.2}x ({} ran first)",
            r + 1,
            stream.converged.as_secs_f64(),
            baseline.converged.as_secs_f64(),
            order[0].name()
        );
        for p in [stream, baseline] {
            let name = p.path.name();
            runs.record(&format!("{name}.converged_s"), p.converged.as_secs_f64());
            runs.record(
                &format!("{name}.final_after_last_answer_s"),
                p.settled().as_secs_f64(),
            );
            runs.record(
                &format!("{name}.update_statements_per_receipt_pct"),
                100.0 * p.update_statements() as f64 / n,
            );
            runs.record(
                &format!("{name}.receipts_per_s"),
                n / p.converged.as_secs_f64(),
            );
            runs.record(
                &format!("{name}.requests_per_s"),
                n / p.answered.as_secs_f64(),
            );
            runs.record(
                &format!("{name}.update_statements"),
                p.update_statements() as f64,
            );
            runs.record(
                &format!("{name}.watermark_rows_updated"),
                p.rows_updated() as f64,
            );
            runs.record(&format!("{name}.transactions"), p.db.commits as f64);
            runs.record(&format!("{name}.rollbacks"), p.db.rollbacks as f64);
            runs.record(
                &format!("{name}.read_updated_events"),
                p.read_updated_events as f64,
            );
        }
        runs.record("stream_speedup", speedup);
        if let Some(ceiling) = stream.ceiling {
            // The most the stream could converge faster on this machine: every request at
            // the ceiling, then the same wait for the last window as it had.
            let best = n / ceiling + stream.settled().as_secs_f64();
            runs.record("http_ceiling_requests_per_s", ceiling);
            runs.record(
                "speedup_at_the_http_ceiling",
                baseline.converged.as_secs_f64() / best,
            );
        }
        reports.push(json!({
            "run": r + 1,
            "order": order.map(Path::name),
            "stream": stream.json(n),
            "baseline_per_receipt": baseline.json(n),
            "stream_speedup": speedup,
        }));
    }
    if args.repeat > 1 {
        runs.print();
    }
    let report = json!({
        "benchmark": "read-storm",
        "machine": machine(),
        "args": {
            "receipts": args.receipts, "group_members": args.group_members,
            "directs": args.directs, "concurrency": args.concurrency, "repeat": args.repeat,
            "acks": args.acks,
        },
        "offered_rate": "as fast as --concurrency clients get answers (no rate is requested)",
        "runs": reports,
        "summary": runs.json(),
    });
    chatpipe_tests::bench::write_report(&args.out, &report)?;
    Ok(())
}

fn print_phase(p: &Phase, args: &Args, run: usize) {
    let n = args.receipts as f64;
    println!(
        "run {} {:<8} {} receipts from {} clients: all answered after {:.2} s ({:.0} requests/s); \
         every receipt consumed and every watermark final after {:.2} s ({:.0} receipts/s), \
         {:.2} s after the last answer",
        run + 1,
        p.path.name(),
        args.receipts,
        args.concurrency,
        p.answered.as_secs_f64(),
        n / p.answered.as_secs_f64(),
        p.converged.as_secs_f64(),
        n / p.converged.as_secs_f64(),
        p.settled().as_secs_f64(),
    );
    if let Some(ceiling) = p.ceiling {
        println!(
            "    this machine's HTTP ceiling: the same client and API answer GET /healthz at {ceiling:.0} requests/s; \
             the storm's requests ran at {:.0}% of it",
            100.0 * n / p.answered.as_secs_f64() / ceiling
        );
    }
    println!(
        "    PostgreSQL: {} watermark UPDATE statements, {} watermark rows updated, \
         {} member reads, {} transactions committed + {} rolled back, {} statements; \
         Kafka: {} receipts produced, {} consumed; {} {}{}",
        p.update_statements(),
        p.rows_updated(),
        p.member_reads(),
        p.db.commits,
        p.db.rollbacks,
        p.db.statement_calls(),
        p.records_produced,
        p.records_consumed,
        p.read_updated_events,
        args.storm().event,
        p.db.caveat(),
    );
}

/// One phase on a database of its own: seed it, start the API (and, for the stream, the
/// receipts processor), send every receipt, wait until it all converged, stop, count.
async fn phase(
    args: &Args,
    db: &str,
    path: Path,
    storm: &[(usize, i64)],
    keys: &TokenKeys,
) -> anyhow::Result<Phase> {
    let url = create_database(&args.database_url, db).await?;
    let mut conn = PgConnection::connect(&url).await?;
    ingest_api::startup::MIGRATOR.run(&mut conn).await?;
    let members = seed(&mut conn, args).await?;
    let receipts: Vec<(i64, i64, i64)> = storm
        .iter()
        .map(|&(m, seq)| (members[m].0, members[m].1, seq))
        .collect();
    let mut expected: HashMap<(i64, i64), i64> = HashMap::new();
    for &(conv, user, seq) in &receipts {
        let e = expected.entry((conv, user)).or_insert(0);
        *e = (*e).max(seq.min(LAST_SEQ));
    }
    load_expected(&mut conn, &expected).await?;
    conn.close().await?;

    // Before: the seeding connection is gone, so its counts are in.
    let mut stats = PgStats::connect(&args.database_url, db).await?;
    stats.wait_alone(Duration::from_secs(30)).await?;
    let before = stats
        .read_settled(Duration::from_secs(1), Duration::from_secs(60))
        .await?;

    let storm = args.storm();
    // The reads' topic exists in both storms: the processor reads both.
    let reads_topic = format!("{db}.chat.read-receipts");
    let acks_topic = format!("{db}.chat.delivery-acks");
    let topic = format!("{db}.{}", storm.topic);
    let group = format!("{db}-{}", storm.route);
    let subject = format!("{db}.chat.events-value");
    let stop = chatpipe_runtime::CancellationToken::new();
    let processor = match path {
        Path::Baseline => None,
        Path::Stream => {
            create_topic(&args.stack.brokers, &reads_topic).await?;
            create_topic(&args.stack.brokers, &acks_topic).await?;
            let mut settings = pipeline::settings::Settings::load(None)?;
            settings.kafka.brokers = args.stack.brokers.clone();
            settings.registry.url = args.stack.registry.clone();
            settings.registry.events_subject = subject.clone();
            settings.database.url = chatpipe_tests::as_service(&url).into();
            settings.receipts.topic = reads_topic.clone();
            settings.receipts.group = format!("{db}-read");
            settings.receipts.acks_topic = acks_topic.clone();
            settings.receipts.acks_group = format!("{db}-delivered");
            settings.outbox.retain_until_confirmed = true;
            let stop = stop.clone();
            Some(std::thread::spawn(move || {
                pipeline::receipts::run(&settings, stop)
            }))
        }
    };
    let mut settings = Settings::defaults_with_secret(JWT_SECRET);
    settings.http.addr = "127.0.0.1:0".parse()?;
    settings.admin.addr = "127.0.0.1:0".parse()?;
    // Every client of the storm is this process, on one address: it may hold more
    // connections than its concurrency for a moment (a pool opens a new one while an
    // answered one is being returned), which the per-address bound would refuse (503).
    settings.http.max_connections_per_ip = settings.http.max_connections;
    settings.database.url = SecretString::from(chatpipe_tests::as_service(&url));
    settings.database.migrate_on_start = false;
    settings.registry.url = args.stack.registry.clone();
    settings.registry.events_subject = subject;
    settings.outbox.retain_until_confirmed = true;
    settings.kafka.brokers = args.stack.brokers.clone();
    settings.kafka.receipts_topic = reads_topic.clone();
    settings.kafka.acks_topic = acks_topic.clone();
    settings.reads.mode = match path {
        Path::Stream => ReadMode::Stream,
        Path::Baseline => ReadMode::Direct,
    };
    let app = Application::build(settings).await?;
    let base = format!("http://{}", app.local_addr());
    let (stop_api, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(app.run_until_stopped(async {
        let _ = stopped.await;
    }));
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(args.concurrency)
        .build()?;
    let mut tokens: HashMap<i64, String> = HashMap::new();
    for &(_, user, _) in &receipts {
        tokens
            .entry(user)
            .or_insert_with(|| keys.issue(UserId::of(user), Duration::from_secs(3600)));
    }
    let want = match path {
        Path::Stream => 202,
        Path::Baseline => 200,
    };

    let started = Instant::now();
    let answers: Vec<anyhow::Result<u16>> =
        futures::stream::iter(receipts.iter().map(|&(conv, user, seq)| {
            let req = http
                .post(format!("{base}/v1/conversations/{conv}/{}", storm.route))
                .bearer_auth(&tokens[&user])
                .json(&json!({"seq": seq}));
            async move { Ok(req.send().await?.status().as_u16()) }
        }))
        .buffer_unordered(args.concurrency)
        .collect()
        .await;
    let answered = started.elapsed();
    let mut refused: HashMap<String, usize> = HashMap::new();
    for a in answers {
        match a {
            Ok(status) if status == want => {}
            Ok(status) => *refused.entry(status.to_string()).or_default() += 1,
            Err(e) => *refused.entry(e.to_string()).or_default() += 1,
        }
    }
    anyhow::ensure!(
        refused.is_empty(),
        "{} requests not answered {want}: {refused:?}",
        path.name()
    );

    // Converged: nothing left unread on the topic, and every watermark final.
    let progress = match path {
        Path::Stream => Some(GroupProgress::new(&args.stack.brokers, &group, &topic)?),
        Path::Baseline => None,
    };
    let deadline = started + Duration::from_secs(600);
    loop {
        let unread = match &progress {
            Some(p) => tokio::task::block_in_place(|| p.read())?.1,
            None => 0,
        };
        let pending = stats
            .scalar(&format!(
                "SELECT count(*) FROM bench_expected e JOIN conversation_member m USING (conversation_id, user_id)
                  WHERE m.{} <> e.seq",
                storm.column
            ))
            .await?;
        if unread == 0 && pending == 0 {
            break;
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "{}: {unread} receipts unread, {pending} watermarks not final after 600 s",
            path.name()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let converged = started.elapsed();
    let ceiling = match path {
        Path::Stream => Some(http_ceiling(&http, &base, receipts.len(), args.concurrency).await?),
        Path::Baseline => None,
    };

    // After: the API and the processor have closed their connections.
    let _ = stop_api.send(());
    server.await??;
    stop.cancel();
    if let Some(processor) = processor {
        processor
            .join()
            .map_err(|_| anyhow::anyhow!("the receipts processor panicked"))??;
    }
    stats.wait_alone(Duration::from_secs(30)).await?;
    let after = stats
        .read_settled(Duration::from_secs(1), Duration::from_secs(60))
        .await?;
    let read_updated_events = stats
        .scalar(&format!(
            "SELECT count(*) FROM outbox WHERE type = '{}'",
            storm.event
        ))
        .await?;
    let (records_produced, records_consumed) = match &progress {
        Some(p) => {
            let (consumed, _) = tokio::task::block_in_place(|| p.read())?;
            let produced = tokio::task::block_in_place(|| records_on(&args.stack.brokers, &topic))?;
            (produced, consumed)
        }
        None => (0, 0),
    };
    drop(stats);
    drop_database(&args.database_url, db).await?;
    Ok(Phase {
        path,
        update: storm.update,
        answered,
        converged,
        db: after.since(&before),
        read_updated_events,
        records_produced,
        records_consumed,
        ceiling,
    })
}

/// This machine's ceiling for the stream path's requests: the same number of requests
/// from the same client at the same concurrency to the same API, which answers them
/// without any work (`GET /healthz`: no token check, no body, no Kafka). Requests per
/// second.
async fn http_ceiling(
    http: &reqwest::Client,
    base: &str,
    requests: usize,
    concurrency: usize,
) -> anyhow::Result<f64> {
    let started = Instant::now();
    let failed = futures::stream::iter((0..requests).map(|_| {
        let req = http.get(format!("{base}/healthz"));
        async move { matches!(req.send().await, Ok(r) if r.status() == 200) }
    }))
    .buffer_unordered(concurrency)
    .filter(|ok| futures::future::ready(!ok))
    .count()
    .await;
    anyhow::ensure!(failed == 0, "{failed} GET /healthz not answered 200");
    Ok(requests as f64 / started.elapsed().as_secs_f64())
}

async fn create_database(server: &str, name: &str) -> anyhow::Result<String> {
    let mut admin = PgConnection::connect(server).await.context("PostgreSQL")?;
    admin
        .execute(format!("CREATE DATABASE \"{name}\"").as_str())
        .await?;
    Ok(chatpipe_tests::with_database(server, name))
}

async fn drop_database(server: &str, name: &str) -> anyhow::Result<()> {
    let mut admin = PgConnection::connect(server).await?;
    admin
        .execute(format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)").as_str())
        .await?;
    Ok(())
}

/// The conversations and members, written directly (last_seq = 100, no message rows:
/// the watermark UPDATE reads only conversation.last_seq). Returns (conversation, user)
/// in order, the same in every freshly seeded database.
async fn seed(conn: &mut PgConnection, args: &Args) -> anyhow::Result<Vec<(i64, i64)>> {
    let group: i64 = sqlx::query_scalar(
        "INSERT INTO conversation (type, title, created_by, last_seq, member_count) VALUES ('GROUP', 'storm', 1, $1, $2) RETURNING id",
    )
    .bind(LAST_SEQ)
    .bind(args.group_members as i32)
    .fetch_one(&mut *conn)
    .await?;
    sqlx::query("INSERT INTO conversation_member (conversation_id, user_id) SELECT $1, u FROM generate_series(1, $2) u")
        .bind(group)
        .bind(args.group_members)
        .execute(&mut *conn)
        .await?;
    sqlx::query(
        "WITH c AS (
             INSERT INTO conversation (type, created_by, last_seq, member_count)
             SELECT 'DIRECT', 100000 + i, $1, 2 FROM generate_series(1, $2) i RETURNING id, created_by
         )
         INSERT INTO conversation_member (conversation_id, user_id)
         SELECT id, created_by FROM c UNION ALL SELECT id, created_by + 500000 FROM c",
    )
    .bind(LAST_SEQ)
    .bind(args.directs)
    .execute(&mut *conn)
    .await?;
    Ok(sqlx::query_as(
        "SELECT conversation_id, user_id FROM conversation_member ORDER BY conversation_id, user_id",
    )
    .fetch_all(&mut *conn)
    .await?)
}

async fn load_expected(
    conn: &mut PgConnection,
    expected: &HashMap<(i64, i64), i64>,
) -> anyhow::Result<()> {
    let (mut c, mut u, mut s) = (Vec::new(), Vec::new(), Vec::new());
    for (&(conv, user), &seq) in expected {
        c.push(conv);
        u.push(user);
        s.push(seq);
    }
    sqlx::query(
        "CREATE TABLE bench_expected AS SELECT * FROM unnest($1::bigint[], $2::bigint[], $3::bigint[]) AS e(conversation_id, user_id, seq)",
    )
    .bind(&c)
    .bind(&u)
    .bind(&s)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

async fn create_topic(brokers: &str, topic: &str) -> anyhow::Result<()> {
    use rdkafka::admin::{AdminOptions, NewTopic, TopicReplication};
    let admin: chatpipe_core::kafka::AdminClient = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create_guarded()?;
    for r in admin
        .create_topics(
            &[NewTopic::new(topic, 6, TopicReplication::Fixed(1))],
            &AdminOptions::new(),
        )
        .await?
    {
        r.map_err(|(t, e)| anyhow::anyhow!("{t}: {e}"))?;
    }
    Ok(())
}
