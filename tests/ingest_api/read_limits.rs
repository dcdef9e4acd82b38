//! What reads cost an abuser: every call that reads or marks read takes a token of the
//! caller's `rate_limits.reads` bucket, and the public `/readyz`, which needs no token,
//! asks the database at most once a second however often it is called.

use std::time::{Duration, Instant};

use chatpipe_tests::{spawn_app, spawn_app_with, Resp};
use futures::{stream, StreamExt};
use ingest_api::configuration::Bucket;
use serde_json::json;
use sqlx::Connection;

/// How often PostgreSQL ran the readiness probe in `db` (pg_stat_statements).
async fn probes(server: &mut sqlx::PgConnection, db: &str) -> i64 {
    sqlx::query_scalar(
        "SELECT coalesce(sum(s.calls), 0)::bigint FROM pg_stat_statements s
           JOIN pg_database d ON d.oid = s.dbid
          WHERE d.datname = $1 AND s.query = 'SELECT $1 AS ready'",
    )
    .bind(db)
    .fetch_one(server)
    .await
    .unwrap()
}

#[track_caller]
fn refused(res: Resp) {
    assert!(res.headers.contains_key("retry-after"), "{res:?}");
    let problem = res.problem(429);
    assert_eq!(problem["type"], "/problems/rate-limited");
}

/// A bucket of 7 reads: history, inbox, sync, members, receipts, /read and /delivered
/// take one each; the next of any kind is 429, and a refused /read moves no watermark.
#[tokio::test]
async fn every_kind_of_read_takes_from_one_bucket_and_is_refused_with_429_past_it() {
    let metrics = chatpipe_tests::OwnMetrics::start();
    let app = spawn_app_with(|s| {
        s.rate_limits.reads = Bucket {
            rate: 1,
            per_secs: 60,
            burst: 7,
        };
    })
    .await;
    let (alice, bob) = (app.user(10), app.user(20));
    let conv = alice.create_group(&[20]).await;
    for body in ["one", "two", "three"] {
        alice.send_message(conv, body).await;
    }
    let base = format!("/v1/conversations/{conv}");
    bob.get(&format!("{base}/messages")).await.expect(200);
    bob.get("/v1/inbox").await.expect(200);
    bob.get("/v1/sync").await.expect(200);
    bob.get(&format!("{base}/members")).await.expect(200);
    bob.get(&format!("{base}/messages/1/receipts"))
        .await
        .expect(200);
    bob.post(&format!("{base}/read"), json!({"seq": 1}))
        .await
        .expect(200);
    bob.post(&format!("{base}/delivered"), json!({"seq": 2}))
        .await
        .expect(200);

    refused(bob.post(&format!("{base}/read"), json!({"seq": 3})).await);
    refused(
        bob.post(&format!("{base}/delivered"), json!({"seq": 3}))
            .await,
    );
    for path in [
        format!("{base}/messages"),
        "/v1/inbox".into(),
        "/v1/sync".into(),
        format!("{base}/members"),
        format!("{base}/messages/1/receipts"),
    ] {
        refused(bob.get(&path).await);
    }
    assert_eq!(
        app.watermarks(conv, 20).await,
        (1, 2),
        "refused marks moved nothing"
    );
    // Alice's bucket is her own.
    alice.get(&format!("{base}/messages")).await.expect(200);
    // The seven refusals above, each counted once.
    assert_eq!(metrics.sum("rate_limited_total", &["kind=\"read\""]), 7.0);
}

/// 1,000 calls of the public `/readyz`, 50 at a time: PostgreSQL ran the probe at most
/// once per second they took (plus the first), as its pg_stat_statements counts.
#[tokio::test]
async fn the_public_readyz_asks_the_database_at_most_once_a_second() {
    let app = spawn_app().await;
    let db: String = sqlx::query_scalar("SELECT current_database()")
        .fetch_one(&app.pool)
        .await
        .unwrap();
    let mut server = sqlx::PgConnection::connect(&chatpipe_tests::server_url())
        .await
        .unwrap();
    let before = probes(&mut server, &db).await;
    let anonymous = app.with_auth(None);
    let started = Instant::now();
    let answers: Vec<u16> = stream::iter(0..1_000)
        .map(|_| async { anonymous.get("/readyz").await.status })
        .buffer_unordered(50)
        .collect()
        .await;
    let took = started.elapsed();
    assert!(answers.iter().all(|&s| s == 200), "{answers:?}");
    let ran = probes(&mut server, &db).await - before;
    let allowed = took.as_secs_f64().ceil() as i64 + 1;
    println!("1,000 calls in {took:?}: {ran} probes (at most {allowed})");
    assert!(ran >= 1, "the probe never reached PostgreSQL");
    assert!(ran <= allowed, "{ran} probes in {took:?}");
    // A stale answer is probed again.
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    anonymous.get("/readyz").await.expect(200);
    assert_eq!(probes(&mut server, &db).await - before, ran + 1);
}
