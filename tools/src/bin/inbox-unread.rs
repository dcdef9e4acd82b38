//! Inbox unread with deletes, threads and mentions: `GET /inbox?limit=50` of user A, a
//! member of 500 groups holding `scale` messages in all, 10% of them deleted (seq % 10 =
//! 3), 20% replies (seq % 5 = 1, each to the message before it, a thread A follows) and
//! 2% naming A (seq % 50 = 7), against user B, the same shape without a delete, a reply
//! or a mention (the inbox as it was before threads and mentions), as requests to an
//! ingest-api started in this process, interleaved (A, B, A, B…) from a few clients.
//! unreadCount is the subtraction `(last_seq - deleted_count - reply_count) -
//! (last_read_seq - deleted_read - reply_read)`, unreadThreads and mentionCount are
//! counters: the target is p99(A) within 1.2x of p99(B), and p99 flat from 1M to 10M
//! messages (issues 23 and 29). A measurement, not a test.
//!
//!   eval "$(scripts/stack env)"; cargo build --release -p chatpipe-tools --bin inbox-unread
//!   target/release/inbox-unread [--scales 1000000,10000000] [--requests 2000] [--repeat 1]
//!
//! Each scale gets a fresh database (`bench_inbox_unread_<pid>_<scale>`, dropped after,
//! also on failure; those of dead runs are dropped at start) migrated as the API's, then
//! filled by set-based SQL (generate_series, not the API): 1,000 groups (A's and B's
//! 500, each with a second member), the messages (bodies of 60 bytes, deleted ones with
//! body NULL, deleted_at and deleted_by), then deleted_count, last_read_seq and
//! deleted_read computed from the rows (and A's threads, follows, mentions and their
//! counters), then VACUUM ANALYZE. `message` is made UNLOGGED
//! before loading: the server's logical replication slot (Debezium) would otherwise
//! retain the GBs of WAL the load writes. That changes nothing on the read path measured.
//! Disk: ~235 bytes per message, 2 x scale messages (4.7 GB at 10M); checked before each.
//!
//! Two watermark settings, the same for A and B: `last-N` (last_seq - `--unread`, some
//! unread everywhere) and `zero` (nothing read: the worst case for any counting approach).
//! Each is first checked: every unreadCount of A's and B's inbox (all pages) equals the
//! count of messages after the watermark that are not deleted. As a contrast (not the
//! target), the inbox SQL runs directly (sqlx, no HTTP) for A with unread as the
//! subtraction and with unread counted per conversation (the naive way to skip deleted
//! rows): the cost of counting that the subtraction avoids. The JSON report also holds
//! EXPLAIN (ANALYZE, BUFFERS) of both for each setting.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use chatpipe_core::auth::TokenKeys;
use chatpipe_core::UserId;
use chatpipe_tests::bench::{machine, write_report, Runs};
use clap::Parser;
use hdrhistogram::Histogram;
use ingest_api::configuration::Settings;
use ingest_api::startup::Application;
use ingest_api::store::inbox::{page_sql, UNREAD};
use secrecy::SecretString;
use serde_json::{json, Value};
use sqlx::postgres::{PgArguments, PgPoolOptions};
use sqlx::query::QueryScalar;
use sqlx::{Connection, Executor, PgConnection, PgPool, Postgres};

#[derive(Parser)]
struct Args {
    /// Messages in all of each user's 500 conversations; one fresh database per value.
    #[arg(long, value_delimiter = ',', default_values_t = [1_000_000i64, 10_000_000])]
    scales: Vec<i64>,
    /// Inbox requests per user per round, through the API (a tenth of it to warm up).
    #[arg(long, default_value_t = 2000)]
    requests: usize,
    /// Clients sending at once.
    #[arg(long, default_value_t = 4)]
    concurrency: usize,
    /// Queries of each contrast (the inbox SQL for A, directly) per round.
    #[arg(long, default_value_t = 200)]
    contrast_requests: usize,
    /// The first watermark setting: last_read_seq = last_seq - this.
    #[arg(long, default_value_t = 20)]
    unread: i64,
    /// Measurement rounds per setting on the same data; the table gives the median.
    #[arg(long, default_value_t = 1)]
    repeat: usize,
    #[command(flatten)]
    stack: chatpipe_tests::bench::StackArgs,
    #[arg(long, default_value = "target/bench/inbox-unread.json")]
    out: String,
}

const JWT_SECRET: &str = "inbox-unread-secret-inbox-unread-secret!";
const DB_PREFIX: &str = "bench_inbox_unread_";
/// Each user's conversations. A is user 1, B user 2; second members are 1000 + id.
const CONVERSATIONS: i64 = 500;
const LIMIT: i64 = 50;
const HEADER: &str = "scale  watermark  A p50/p99 ms     B p50/p99 ms     p99 A/B | \
                      contrast, SQL for A, p99 ms: subtraction  counting";

/// Unread by counting rows, per conversation (the contrast, and the check): the top-level
/// messages after the watermark that are not deleted.
const COUNTING: &str = "(SELECT count(*) FROM message g WHERE g.conversation_id = c.id
                           AND g.seq > m.last_read_seq AND g.deleted_at IS NULL
                           AND g.thread_root_seq IS NULL)";

/// One timed operation; a round interleaves its operations on every client.
#[derive(Clone)]
enum Op {
    /// GET /inbox with this bearer token.
    Api(String),
    /// The inbox SQL for user A, directly.
    Sql(&'static str),
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    anyhow::ensure!(args.repeat >= 1 && args.concurrency >= 1 && args.requests >= 1);
    anyhow::ensure!(args.scales.iter().all(|&s| s >= CONVERSATIONS));
    chatpipe_core::telemetry::init_logging();
    let server = chatpipe_tests::server_url();
    let mut admin = PgConnection::connect(&server).await.context("PostgreSQL")?;
    let stale: Vec<String> =
        sqlx::query_scalar("SELECT datname FROM pg_database WHERE datname LIKE $1")
            .bind(format!("{DB_PREFIX}%"))
            .fetch_all(&mut admin)
            .await?;
    for db in stale {
        let pid = db[DB_PREFIX.len()..].split('_').next().unwrap_or("");
        if pid.is_empty() || !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            println!("dropping {db}, left by a run that is gone");
            drop_database(&mut admin, &db).await?;
        }
    }
    let keys = TokenKeys::new(&SecretString::from(JWT_SECRET), Duration::ZERO)?;
    let marks = [
        (format!("last-{}", args.unread), args.unread),
        ("zero".into(), i64::MAX),
    ];
    let (mut runs, mut scales) = (Runs::default(), Vec::new());
    let mut bytes_per_message = 350.0; // until the first scale measured it
    for &scale in &args.scales {
        check_disk(&mut admin, 2.0 * scale as f64 * bytes_per_message).await?;
        let db = format!("{DB_PREFIX}{}_{scale}", std::process::id());
        drop_database(&mut admin, &db).await?;
        admin.execute(&*format!("CREATE DATABASE \"{db}\"")).await?;
        let url = chatpipe_tests::with_database(&server, &db);
        let result = run_scale(&args, &url, scale, &marks, &keys, &mut runs).await;
        drop_database(&mut admin, &db).await?;
        let report = result?;
        bytes_per_message = report["database_bytes"].as_f64().unwrap_or(0.0) / (2 * scale) as f64;
        scales.push(report);
    }

    println!(
        "\nGET /inbox?limit={LIMIT} from {} clients, {} requests per user per round; median of {} round(s)\n{HEADER}",
        args.concurrency, args.requests, args.repeat
    );
    for &scale in &args.scales {
        for (mark, _) in &marks {
            println!("{}", row(&runs, scale, mark));
        }
    }
    let mut growth = serde_json::Map::new();
    let (first, last) = (args.scales[0], args.scales[args.scales.len() - 1]);
    for (mark, _) in marks.iter().filter(|_| first != last) {
        let p99 = |s, u| median(&runs, &format!("{}.{mark}.api_{u}_p99_ms", label(s)));
        let a = p99(last, "a") / p99(first, "a");
        let b = p99(last, "b") / p99(first, "b");
        let (l, f) = (label(last), label(first));
        println!("p99 at {l} / p99 at {f}, {mark}: A {a:.2}x, B {b:.2}x (target: flat)");
        growth.insert(mark.clone(), json!({"a_p99_ratio": a, "b_p99_ratio": b}));
    }
    println!("contrast, not the target: the inbox SQL alone for A, unread subtracted vs counted");
    if args.repeat > 1 {
        runs.print();
    }
    let report = json!({
        "benchmark": "inbox-unread",
        "machine": machine(),
        "args": {
            "scales": args.scales, "conversations_per_user": CONVERSATIONS,
            "requests": args.requests, "concurrency": args.concurrency,
            "contrast_requests": args.contrast_requests, "unread": args.unread,
            "repeat": args.repeat, "limit": LIMIT,
        },
        "target": "p99 of A (10% deleted) within 1.2x of B (no deletes); p99 flat across scales",
        "scales": scales,
        "p99_growth_last_vs_first_scale": growth,
        "summary": runs.json(),
    });
    write_report(&args.out, &report)
}

/// One scale on its fresh database `url`: load, start the API, then per watermark
/// setting check, warm up and measure.
async fn run_scale(
    args: &Args,
    url: &str,
    scale: i64,
    marks: &[(String, i64)],
    keys: &TokenKeys,
    runs: &mut Runs,
) -> anyhow::Result<Value> {
    let mut conn = PgConnection::connect(url).await?;
    ingest_api::startup::MIGRATOR.run(&mut conn).await?;
    // Each partition (a partitioned table has no storage of its own to unlog).
    conn.execute(
        "DO $$ DECLARE p regclass; BEGIN
             FOR p IN SELECT relid FROM pg_partition_tree('message') WHERE isleaf LOOP
                 EXECUTE format('ALTER TABLE %s SET UNLOGGED', p);
             END LOOP;
         END $$",
    )
    .await?;
    let started = Instant::now();
    load(&mut conn, scale).await?;
    let loaded = started.elapsed().as_secs_f64();
    conn.execute("VACUUM ANALYZE message, conversation, conversation_member")
        .await?;
    let vacuumed = started.elapsed().as_secs_f64() - loaded;
    let (db_bytes, message_bytes): (i64, i64) = sqlx::query_as(
        "SELECT pg_database_size(current_database()),
                (SELECT sum(pg_total_relation_size(relid))::bigint
                   FROM pg_partition_tree('message'))",
    )
    .fetch_one(&mut conn)
    .await?;
    let (db_gb, msg_gb) = (db_bytes as f64 / 1e9, message_bytes as f64 / 1e9);
    println!(
        "{}: {scale} messages per user loaded in {loaded:.1} s, VACUUM ANALYZE {vacuumed:.1} s; \
         database {db_gb:.2} GB (message and its indexes {msg_gb:.2} GB), {:.0} bytes per message",
        label(scale),
        db_bytes as f64 / (2 * scale) as f64
    );

    let mut settings = Settings::defaults_with_secret(JWT_SECRET);
    settings.http.addr = "127.0.0.1:0".parse()?;
    settings.admin.addr = "127.0.0.1:0".parse()?;
    settings.database.url = SecretString::from(chatpipe_tests::as_service(url));
    settings.database.migrate_on_start = false;
    // Two users reading as fast as 4 clients can: measured, not refused (the per-user
    // read limit, rate_limits.reads, is for people).
    settings.rate_limits.reads = ingest_api::configuration::Bucket::OFF;
    settings.registry.url = args.stack.registry.clone();
    settings.kafka.brokers = args.stack.brokers.clone();
    let app = Application::build(settings).await?;
    let bench = Bench {
        inbox: format!("http://{}/v1/inbox", app.local_addr()),
        http: reqwest::Client::builder()
            .timeout(Duration::from_secs(60))
            .build()?,
        pool: (PgPoolOptions::new().max_connections(args.concurrency as u32))
            .connect(url)
            .await?,
        clients: args.concurrency,
    };
    let (stop_api, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(app.run_until_stopped(async {
        let _ = stopped.await;
    }));
    let tokens = [1, 2].map(|u| keys.issue(UserId::of(u), Duration::from_secs(86400)));
    let api = tokens.clone().map(Op::Api);
    // The API's own inbox query, with its unread count and with counting in its place.
    let sql = [UNREAD, COUNTING].map(|u| &*page_sql(u).leak());
    let contrast = sql.map(|s| [Op::Sql(s)]);
    let n = args.contrast_requests;

    let mut settings_json = Vec::new();
    for (mark, behind) in marks {
        set_watermarks(&mut conn, *behind).await?;
        let mut checked = 0;
        for (user, token) in [1, 2].into_iter().zip(&tokens) {
            checked += bench.verify(token, user).await?;
        }
        bench.round(&api, args.requests / 10).await?;
        for ops in &contrast {
            bench.round(ops, n / 10).await?;
        }
        let mut rounds = Vec::new();
        for _ in 0..args.repeat {
            let a_b = bench.round(&api, args.requests).await?;
            let sub = bench.round(&contrast[0], n).await?;
            let count = bench.round(&contrast[1], n).await?;
            let ratio = ms(&a_b[0], 0.99) / ms(&a_b[1], 0.99);
            let key = |f: &str| format!("{}.{mark}.{f}", label(scale));
            runs.record(&key("p99_ratio_a_over_b"), ratio);
            let mut one = json!({"p99_ratio_a_over_b": ratio});
            let api_a_b = [("api_a", &a_b[0]), ("api_b", &a_b[1])];
            let sql_a = [
                ("sql_a_subtraction", &sub[0]),
                ("sql_a_counting", &count[0]),
            ];
            for (name, h) in api_a_b.into_iter().chain(sql_a) {
                runs.record(&key(&format!("{name}_p50_ms")), ms(h, 0.5));
                runs.record(&key(&format!("{name}_p99_ms")), ms(h, 0.99));
                one[name] = json!({"n": h.len(), "p50_ms": ms(h, 0.5), "p90_ms": ms(h, 0.9),
                                   "p99_ms": ms(h, 0.99), "max_ms": ms(h, 1.0)});
            }
            rounds.push(one);
        }
        println!("{HEADER}\n{}", row(runs, scale, mark));
        let mut plans = serde_json::Map::new();
        for (name, s) in ["subtraction", "counting"].into_iter().zip(sql) {
            let explain = format!("EXPLAIN (ANALYZE, BUFFERS) {s}");
            let lines: Vec<String> = bind(sqlx::query_scalar(&explain))
                .fetch_all(&bench.pool)
                .await?;
            plans.insert(name.into(), lines.into());
        }
        settings_json.push(json!({
            "watermark": mark, "unread_checked_conversations": checked, "rounds": rounds,
            "plans_for_a": plans,
        }));
    }
    bench.pool.close().await;
    let _ = stop_api.send(());
    server.await??;
    Ok(json!({
        "scale": scale, "messages": 2 * scale, "deleted_messages_of_a": scale / 10,
        "load_s": loaded, "vacuum_analyze_s": vacuumed,
        "database_bytes": db_bytes, "message_bytes": message_bytes, "settings": settings_json,
    }))
}

/// A's and B's groups with a second member each (the same last_seq and activity order
/// for both), then the messages 50 conversations a statement; A's seq % 10 = 3 deleted.
async fn load(conn: &mut PgConnection, scale: i64) -> anyhow::Result<()> {
    sqlx::query(
        "WITH c AS (
             INSERT INTO conversation (type, title, created_by, created_at, last_seq,
                                       last_message_at, last_activity_at, member_count)
             SELECT 'GROUP', 'group ' || i, u, now() - interval '400 days', $2 + (i <= $3)::int,
                    now() - i * interval '1 minute', now() - i * interval '1 minute', 2
               FROM generate_series(1, 2) u, generate_series(1, $1) i ORDER BY u, i
             RETURNING id, created_by, created_at)
         INSERT INTO conversation_member (conversation_id, user_id, role, joined_at)
         SELECT id, created_by, 'ADMIN', created_at FROM c
         UNION ALL SELECT id, 1000 + id, 'MEMBER', created_at FROM c",
    )
    .bind(CONVERSATIONS)
    .bind(scale / CONVERSATIONS)
    .bind(scale % CONVERSATIONS)
    .execute(&mut *conn)
    .await?;
    // client_msg_id from (conversation, seq): ascending, so both indexes fill at their end.
    for first in (1..=2 * CONVERSATIONS).step_by(50) {
        sqlx::query(
            "INSERT INTO message (conversation_id, seq, sender_id, client_msg_id, body, created_at,
                                  deleted_at, deleted_by, thread_root_seq)
             SELECT c.id, s, sender, (lpad(to_hex(c.id), 16, '0') || lpad(to_hex(s), 16, '0'))::uuid,
                    CASE WHEN NOT del THEN rpad('message ' || s || ' of ' || c.id || ': ', 60, 'lorem ipsum ') END,
                    at, CASE WHEN del THEN at + interval '1 minute' END, CASE WHEN del THEN sender END,
                    CASE WHEN c.created_by = 1 AND s % 5 = 1 AND s > 1 THEN s - 1 END
               FROM (SELECT * FROM conversation WHERE id BETWEEN $1 AND $1 + 49 ORDER BY id) c,
                    generate_series(1, c.last_seq) s,
                    LATERAL (SELECT c.created_by = 1 AND s % 10 = 3 AS del,
                                    CASE WHEN s % 2 = 0 THEN c.created_by ELSE 1000 + c.id END AS sender,
                                    c.last_message_at - (c.last_seq - s) * interval '1 second' AS at) x",
        )
        .bind(first)
        .execute(&mut *conn)
        .await?;
        eprint!("\r  conversations loaded: {}", first + 49);
    }
    eprintln!();
    conn.execute(
        "UPDATE conversation c SET deleted_count = (SELECT count(*) FROM message g
          WHERE g.conversation_id = c.id AND g.deleted_at IS NOT NULL),
                reply_count = (SELECT count(*) FROM message g
          WHERE g.conversation_id = c.id AND g.thread_root_seq IS NOT NULL)",
    )
    .await?;
    load_threads_and_mentions(conn).await
}

/// A's threads (one reply each) with A following every one, and the mentions of A by
/// the second members, as the writers would have left them.
async fn load_threads_and_mentions(conn: &mut PgConnection) -> anyhow::Result<()> {
    conn.execute(
        "INSERT INTO message_thread (conversation_id, root_seq, reply_count, last_reply_seq,
                                     last_live_seq, last_reply_at, repliers)
         SELECT g.conversation_id, g.thread_root_seq, 1, g.seq, g.seq, g.created_at,
                ARRAY[g.sender_id]
           FROM message g WHERE g.thread_root_seq IS NOT NULL",
    )
    .await?;
    conn.execute(
        "INSERT INTO thread_follow (conversation_id, root_seq, user_id, last_read_seq, following)
         SELECT t.conversation_id, t.root_seq, 1, 0, true FROM message_thread t",
    )
    .await?;
    conn.execute(
        "INSERT INTO message_mention (conversation_id, user_id, seq, sender_id, created_at)
         SELECT g.conversation_id, 1, g.seq, g.sender_id, g.created_at
           FROM conversation c JOIN message g ON g.conversation_id = c.id
          WHERE c.created_by = 1 AND g.seq % 50 = 7 AND g.sender_id <> 1",
    )
    .await?;
    conn.execute(
        "UPDATE conversation_member m SET mention_count = (SELECT count(*) FROM message_mention n
          WHERE n.conversation_id = m.conversation_id AND n.user_id = m.user_id)",
    )
    .await?;
    conn.execute("VACUUM ANALYZE message_thread, thread_follow, message_mention")
        .await?;
    Ok(())
}

/// Every member's watermark to last_seq - `behind` (at least 0), and A's place in each
/// thread to the same seq; the counters the watermarks move counted from the rows.
async fn set_watermarks(conn: &mut PgConnection, behind: i64) -> anyhow::Result<()> {
    sqlx::query(
        "UPDATE conversation_member m SET last_read_seq = w.seq,
                deleted_read = (SELECT count(*) FROM message d WHERE d.conversation_id = m.conversation_id
                                   AND d.deleted_at IS NOT NULL AND d.thread_root_seq IS NULL
                                   AND d.seq <= w.seq),
                reply_read = (SELECT count(*) FROM message d WHERE d.conversation_id = m.conversation_id
                                 AND d.thread_root_seq IS NOT NULL AND d.seq <= w.seq),
                mention_read = (SELECT count(*) FROM message_mention n
                                 WHERE n.conversation_id = m.conversation_id
                                   AND n.user_id = m.user_id AND n.seq <= w.seq)
           FROM conversation c, LATERAL (SELECT GREATEST(c.last_seq - $1, 0) AS seq) w
          WHERE c.id = m.conversation_id",
    )
    .bind(behind)
    .execute(&mut *conn)
    .await?;
    conn.execute(
        "UPDATE thread_follow f SET last_read_seq = LEAST(m.last_read_seq, t.last_reply_seq)
           FROM conversation_member m, message_thread t
          WHERE m.conversation_id = f.conversation_id AND m.user_id = f.user_id
            AND t.conversation_id = f.conversation_id AND t.root_seq = f.root_seq",
    )
    .await?;
    conn.execute(
        "UPDATE conversation_member m SET unread_threads = (
                SELECT count(*) FROM thread_follow f
                  JOIN message_thread t USING (conversation_id, root_seq)
                 WHERE f.conversation_id = m.conversation_id AND f.user_id = m.user_id
                   AND f.following AND t.last_live_seq > f.last_read_seq)",
    )
    .await?;
    conn.execute("VACUUM ANALYZE conversation_member, thread_follow")
        .await?;
    Ok(())
}

/// What the checks and rounds use: the API's /inbox, a pool on the scale's database, and
/// how many clients send at once.
struct Bench {
    inbox: String,
    http: reqwest::Client,
    pool: PgPool,
    clients: usize,
}

impl Bench {
    /// Every (unreadCount, unreadThreads, mentionCount) of `user`'s inbox (all pages)
    /// equals what the rows say; how many.
    async fn verify(&self, token: &str, user: i64) -> anyhow::Result<usize> {
        let sql = format!(
            "SELECT c.id, ({COUNTING},
                    (SELECT count(*) FROM thread_follow f
                       JOIN message_thread t USING (conversation_id, root_seq)
                      WHERE f.conversation_id = c.id AND f.user_id = m.user_id
                        AND f.following AND t.last_live_seq > f.last_read_seq),
                    (SELECT count(*) FROM message_mention n
                      WHERE n.conversation_id = c.id AND n.user_id = m.user_id
                        AND n.seq > m.last_read_seq))::text
               FROM conversation_member m
               JOIN conversation c ON c.id = m.conversation_id WHERE m.user_id = $1"
        );
        let counted: Vec<(i64, String)> = sqlx::query_as(&sql)
            .bind(user)
            .fetch_all(&self.pool)
            .await?;
        let (mut seen, mut url) = (HashMap::new(), format!("{}?limit=200", self.inbox));
        loop {
            let res = self.http.get(&url).bearer_auth(token).send().await?;
            anyhow::ensure!(res.status() == 200, "GET {url}: {}", res.status());
            let page: Value = res.json().await?;
            for e in page["conversations"].as_array().context("conversations")? {
                let conv = e["conversationId"].as_i64().context("conversationId")?;
                let n = |k: &str| e[k].as_i64().with_context(|| k.to_owned());
                let three = (n("unreadCount")?, n("unreadThreads")?, n("mentionCount")?);
                seen.insert(conv, format!("({},{},{})", three.0, three.1, three.2));
            }
            let Some(cursor) = page["nextCursor"].as_str() else {
                break;
            };
            url = format!("{}?limit=200&cursor={cursor}", self.inbox);
        }
        let wrong: Vec<_> = (counted.iter())
            .filter(|(c, n)| seen.get(c) != Some(n))
            .map(|(c, n)| format!("{c}: counted {n}, API {:?}", seen.get(c)))
            .collect();
        let (w, c, s) = (wrong.len(), counted.len(), seen.len());
        anyhow::ensure!(
            w == 0 && s == c && s as i64 == CONVERSATIONS,
            "WRONG UNREAD of user {user}: {w} of {c} conversations differ, {s} in the inbox; {:?}",
            &wrong[..w.min(5)]
        );
        Ok(s)
    }

    /// `n` of each op, the ops interleaved on every client; latencies in µs per op.
    async fn round(&self, ops: &[Op], n: usize) -> anyhow::Result<Vec<Histogram<u64>>> {
        let ops: Arc<[Op]> = ops.into();
        let url = format!("{}?limit={LIMIT}", self.inbox);
        let mut tasks = tokio::task::JoinSet::new();
        for k in 0..self.clients {
            let (ops, url, http, pool) = (
                ops.clone(),
                url.clone(),
                self.http.clone(),
                self.pool.clone(),
            );
            let count = n / self.clients + usize::from(k < n % self.clients);
            tasks.spawn(async move {
                let mut hists = vec![histogram()?; ops.len()];
                for _ in 0..count {
                    for (op, hist) in ops.iter().zip(&mut hists) {
                        let t = Instant::now();
                        let (took, rows) = match op {
                            Op::Api(token) => {
                                let res = http.get(&url).bearer_auth(token).send().await?;
                                anyhow::ensure!(res.status() == 200, "GET {url}: {}", res.status());
                                let body = res.bytes().await?;
                                let took = t.elapsed();
                                let page: Value = serde_json::from_slice(&body)?;
                                (took, page["conversations"].as_array().map_or(0, Vec::len))
                            }
                            Op::Sql(sql) => {
                                let q = bind(sqlx::query_scalar::<_, i64>(sql));
                                let rows = q.fetch_all(&pool).await?.len();
                                (t.elapsed(), rows - 1) // the API asks for one more than it shows
                            }
                        };
                        hist.record(took.as_micros().max(1) as u64)?;
                        anyhow::ensure!(rows as i64 == LIMIT, "{rows} conversations, not {LIMIT}");
                    }
                }
                anyhow::Ok(hists)
            });
        }
        let mut all = vec![histogram()?; ops.len()];
        while let Some(done) = tasks.join_next().await {
            for (into, h) in all.iter_mut().zip(done??) {
                into.add(h)?;
            }
        }
        Ok(all)
    }
}

fn histogram() -> anyhow::Result<Histogram<u64>> {
    Ok(Histogram::new_with_bounds(1, 600_000_000, 3)?)
}

/// The inbox query's parameters for A's first page (LIMIT + 1 rows, as the API asks).
fn bind<O>(
    q: QueryScalar<'_, Postgres, O, PgArguments>,
) -> QueryScalar<'_, Postgres, O, PgArguments> {
    q.bind(1i64)
        .bind(None::<chrono::DateTime<chrono::Utc>>)
        .bind(0i64)
        .bind(LIMIT + 1)
        .bind(120i32)
}

/// One line of the table: the medians of `scale` and `mark` recorded so far.
fn row(runs: &Runs, scale: i64, mark: &str) -> String {
    let l = label(scale);
    let k = |f: &str| median(runs, &format!("{l}.{mark}.{f}"));
    let (a50, a99, b50, b99) = (
        k("api_a_p50_ms"),
        k("api_a_p99_ms"),
        k("api_b_p50_ms"),
        k("api_b_p99_ms"),
    );
    let (ratio, sub, count) = (
        k("p99_ratio_a_over_b"),
        k("sql_a_subtraction_p99_ms"),
        k("sql_a_counting_p99_ms"),
    );
    format!(
        "{l:<6} {mark:<10} {a50:>7.2}/{a99:<8.2} {b50:>7.2}/{b99:<8.2} {ratio:>6.2}x | {sub:>46.2} {count:>9.2}"
    )
}

fn median(runs: &Runs, name: &str) -> f64 {
    runs.summary(name).map_or(f64::NAN, |s| s.0)
}

fn ms(h: &Histogram<u64>, q: f64) -> f64 {
    h.value_at_quantile(q) as f64 / 1000.0
}

fn label(scale: i64) -> String {
    match scale {
        s if s % 1_000_000 == 0 => format!("{}M", s / 1_000_000),
        s if s % 1000 == 0 => format!("{}k", s / 1000),
        s => s.to_string(),
    }
}

/// Prints the free space of the server's data directory when it is on this machine, and
/// refuses to load `need` bytes into less than 1.3 x that + 2 GB.
async fn check_disk(admin: &mut PgConnection, need: f64) -> anyhow::Result<()> {
    let dir: String = sqlx::query_scalar("SHOW data_directory")
        .fetch_one(&mut *admin)
        .await?;
    let df = std::process::Command::new("df")
        .args(["-B1", "--output=avail", &dir])
        .output()?;
    let free = String::from_utf8_lossy(&df.stdout)
        .lines()
        .nth(1)
        .map(|l| l.trim().parse::<f64>());
    let Some(Ok(free)) = free else {
        println!("disk: cannot read the free space at {dir} (not on this machine?)");
        return Ok(());
    };
    let (free_gb, need_gb) = (free / 1e9, need / 1e9);
    println!("disk: {free_gb:.1} GB free at {dir}, about {need_gb:.1} GB needed");
    anyhow::ensure!(
        free > need * 1.3 + 2e9,
        "not enough disk at {dir} for this scale"
    );
    Ok(())
}

async fn drop_database(admin: &mut PgConnection, name: &str) -> anyhow::Result<()> {
    admin
        .execute(&*format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"))
        .await?;
    Ok(())
}
