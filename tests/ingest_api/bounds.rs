//! Every bound that answers 503 hit on purpose: the request deadline, the pool's acquire
//! wait, the receipt's produce wait and the producer's queue. Each answers a problem
//! body that says to retry, is counted in metrics, and changes nothing.

use std::time::{Duration, Instant};

use chatpipe_tests::{spawn_app_with, OwnMetrics, TestApp};
use ingest_api::configuration::ReadMode;
use serde_json::json;
use sqlx::{Acquire, PgConnection};

/// Takes `conversation`'s row lock in a transaction of the test's own: every send to it
/// waits until the returned connection rolls back.
pub(crate) async fn hold_conversation(
    app: &TestApp,
    conversation: i64,
) -> sqlx::pool::PoolConnection<sqlx::Postgres> {
    let mut conn = app.pool.acquire().await.unwrap();
    sqlx::query("BEGIN").execute(&mut *conn).await.unwrap();
    sqlx::query("SELECT 1 FROM conversation WHERE id = $1 FOR UPDATE")
        .bind(conversation)
        .execute(&mut *conn)
        .await
        .unwrap();
    conn
}

pub(crate) async fn release(mut conn: sqlx::pool::PoolConnection<sqlx::Postgres>) {
    let c: &mut PgConnection = conn.acquire().await.unwrap();
    sqlx::query("ROLLBACK").execute(c).await.unwrap();
}

/// Waits until a session of the app's waits for a lock (the held conversation row).
pub(crate) async fn until_a_send_waits(app: &TestApp) {
    chatpipe_tests::until_lock_waiters(app, 1).await;
}

/// Retries `msg` as a client must after a 503, until it is answered; returns the status
/// and the seq.
async fn send_until_answered(
    app: &TestApp,
    conversation: i64,
    msg: &serde_json::Value,
) -> (u16, i64) {
    let path = format!("/v1/conversations/{conversation}/messages");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let res = app.user(10).post(&path, msg.clone()).await;
        if res.status == 201 || res.status == 200 {
            return (res.status, res.body["seq"].as_i64().unwrap());
        }
        assert!(
            Instant::now() < deadline,
            "the retry is still refused: {} {}",
            res.status,
            res.body
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn a_request_past_its_deadline_answers_503_and_its_retry_finds_the_one_message() {
    let metrics = OwnMetrics::start();
    let app = spawn_app_with(|s| s.http.request_timeout_ms = 500).await;
    let conversation = app.user(10).create_group(&[20]).await;
    let held = hold_conversation(&app, conversation).await;
    let msg = json!({"clientMsgId": uuid::Uuid::new_v4(), "body": "late"});

    let started = Instant::now();
    let problem = app
        .user(10)
        .post(
            &format!("/v1/conversations/{conversation}/messages"),
            msg.clone(),
        )
        .await
        .problem(503);
    assert_eq!(problem["type"], "/problems/timeout", "{problem}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "answered at the deadline, not when the lock went: {:?}",
        started.elapsed()
    );
    assert_eq!(
        metrics.sum("http_request_timeouts_total", &[]),
        1.0,
        "one request timed out, one counted"
    );
    release(held).await;

    // The send's batch is not the request's to cancel: it commits once the lock goes,
    // and the retry (queued behind it in the conversation's lane) is its replay.
    assert_eq!(
        send_until_answered(&app, conversation, &msg).await,
        (200, 1)
    );
    assert_eq!(app.count("SELECT count(*) FROM message").await, 1);
}

#[tokio::test]
async fn a_request_that_gets_no_pool_connection_in_time_answers_503() {
    let metrics = OwnMetrics::start();
    let app = spawn_app_with(|s| {
        s.database.max_connections = 1;
        s.database.min_connections = 1;
        s.database.acquire_timeout_ms = 300;
    })
    .await;
    let conversation = app.user(10).create_group(&[20]).await;
    let held = hold_conversation(&app, conversation).await;
    // This send takes the pool's only connection and waits on the row lock.
    let waiting = {
        let (base, http, token) = (app.base.clone(), app.http.clone(), app.token(10));
        tokio::spawn(async move {
            http.post(format!("{base}/v1/conversations/{conversation}/messages"))
                .bearer_auth(token)
                .json(&json!({"clientMsgId": uuid::Uuid::new_v4(), "body": "first"}))
                .send()
                .await
                .unwrap()
                .status()
        })
    };
    until_a_send_waits(&app).await;

    let problem = app.user(20).get("/v1/inbox").await.problem(503);
    assert_eq!(problem["type"], "/problems/unavailable", "{problem}");
    assert!(metrics.sum("db_pool_acquire_timeouts_total", &[]) >= 1.0);

    release(held).await;
    assert_eq!(waiting.await.unwrap(), 201, "the waiting send went through");
    app.user(20).get("/v1/inbox").await.expect(200);
}

/// An address where no broker listens.
fn nowhere() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().to_string()
}

#[tokio::test]
async fn a_receipt_the_broker_does_not_take_in_time_answers_503_and_moves_nothing() {
    let metrics = OwnMetrics::start();
    let app = spawn_app_with(|s| {
        s.reads.mode = ReadMode::Stream;
        s.kafka.brokers = nowhere();
        s.kafka.produce_timeout_ms = 1_000;
    })
    .await;
    let conversation = app.user(10).create_group(&[20]).await;
    app.user(10).send_message(conversation, "one").await;

    let problem = app
        .user(20)
        .post(
            &format!("/v1/conversations/{conversation}/read"),
            json!({"seq": 1}),
        )
        .await
        .problem(503);
    assert_eq!(problem["type"], "/problems/unavailable", "{problem}");
    assert_eq!(metrics.sum("receipts_produce_failures_total", &[]), 1.0);
    assert_eq!(app.watermark(conversation, 20).await, Some(0));
}

/// A full producer queue is backpressure first: a receipt waits up to
/// `kafka.produce_timeout_ms` for room (rdkafka's queue timeout), then answers 503.
#[tokio::test]
async fn receipts_beyond_the_producer_queue_answer_503_and_are_counted() {
    let metrics = OwnMetrics::start();
    let app = spawn_app_with(|s| {
        s.reads.mode = ReadMode::Stream;
        s.kafka.brokers = nowhere();
        s.kafka.queue_max_messages = 1;
        s.kafka.produce_timeout_ms = 1_000;
    })
    .await;
    let conversation = app.user(10).create_group(&[20, 30, 40, 50]).await;
    app.user(10).send_message(conversation, "one").await;

    // One receipt takes the queue's only place (and waits for the broker); the others
    // find it full.
    let reads = [20, 30, 40, 50].map(|user| {
        let (base, http, token) = (app.base.clone(), app.http.clone(), app.token(user));
        tokio::spawn(async move {
            let res = http
                .post(format!("{base}/v1/conversations/{conversation}/read"))
                .bearer_auth(token)
                .json(&json!({"seq": 1}))
                .send()
                .await
                .unwrap();
            let status = res.status().as_u16();
            let body: serde_json::Value = res.json().await.unwrap();
            (status, body)
        })
    });
    for read in reads {
        let (status, body) = read.await.unwrap();
        assert_eq!(status, 503, "{body}");
        assert_eq!(body["type"], "/problems/unavailable", "{body}");
    }
    assert!(
        metrics.sum("receipts_queue_full_total", &[]) >= 3.0,
        "at least three found the queue full"
    );
    for user in [20, 30, 40, 50] {
        assert_eq!(app.watermark(conversation, user).await, Some(0));
    }
}

/// Waits until `n` sends wait in the app's send queue.
pub(crate) async fn until_sends_wait(app: &TestApp, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while app.sends.waiting() < n {
        assert!(
            Instant::now() < deadline,
            "{} sends wait, not {n}",
            app.sends.waiting()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn a_send_beyond_its_conversations_queue_answers_503_and_its_retry_commits() {
    let metrics = OwnMetrics::start();
    let app = spawn_app_with(|s| {
        s.sends.max_writers = 1;
        s.sends.max_queued = 2;
    })
    .await;
    let conversation = app.user(10).create_group(&[20]).await;
    let held = hold_conversation(&app, conversation).await;
    // The first send is the writer's batch, waiting for the lock; two more wait in the
    // lane, which is then full.
    let path = format!("/v1/conversations/{conversation}/messages");
    let send = |i: usize| {
        let (base, http, token, path) = (
            app.base.clone(),
            app.http.clone(),
            app.token(10),
            path.clone(),
        );
        tokio::spawn(async move {
            http.post(format!("{base}{path}"))
                .bearer_auth(token)
                .json(&json!({"clientMsgId": uuid::Uuid::new_v4(), "body": format!("m{i}")}))
                .send()
                .await
                .unwrap()
                .status()
        })
    };
    // One at first, so that the writer's batch holds it alone.
    let mut queued = vec![send(0)];
    until_a_send_waits(&app).await;
    queued.extend([send(1), send(2)]);
    until_sends_wait(&app, 2).await;

    let msg = json!({"clientMsgId": uuid::Uuid::new_v4(), "body": "one too many"});
    let problem = app.user(10).post(&path, msg.clone()).await.problem(503);
    assert_eq!(problem["type"], "/problems/unavailable", "{problem}");
    assert_eq!(
        metrics.sum("send_queue_rejections_total", &[]),
        1.0,
        "one send refused, one counted"
    );

    release(held).await;
    for send in queued {
        assert_eq!(send.await.unwrap(), 201, "a queued send went through");
    }
    assert_eq!(
        send_until_answered(&app, conversation, &msg).await,
        (201, 4),
        "the refused send wrote nothing; its retry takes the next seq"
    );
}
