//! Test harness: starts the real ingest-api on a free port against the real PostgreSQL,
//! each test in a fresh database of its own.
//!
//! PostgreSQL is found through `DATABASE_URL` (any database of the server; the harness
//! creates its own next to it), default `postgres://postgres:postgres@127.0.0.1:5432/postgres`,
//! which is what `scripts/stack up` starts. If it cannot be reached, the test fails and
//! says so: nothing here skips.

pub mod audit;
pub mod bench;
pub mod binaries;
pub mod cluster;
pub mod cold;
pub mod cpu;
pub mod drill;
pub mod freeze;
pub mod jwks;
pub mod otlp;
pub mod pgbench;
pub mod pgstats;
pub mod push;
pub mod stack;
pub mod stream;
pub mod versions;
pub mod watchdog;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use chatpipe_core::auth::{unix_now, TokenKeys};
use chatpipe_core::UserId;
use chatpipe_schemas::avro::EventCodec;
use chatpipe_schemas::ChatEvent;
use ingest_api::configuration::{ReadMode, Settings};
use ingest_api::startup::Application;
use secrecy::{ExposeSecret, SecretString};
use serde_json::Value;
use sqlx::postgres::PgPoolOptions;
use sqlx::{Connection, Executor, PgConnection, PgPool};

pub const DEFAULT_DATABASE_URL: &str = "postgres://postgres:postgres@127.0.0.1:5432/postgres";
/// scripts/stack.env's SERVICE_DATABASE_URL.
pub const DEFAULT_SERVICE_DATABASE_URL: &str =
    "postgres://chatpipe_service:chatpipe-service-stack-secret@127.0.0.1:5432/chatpipe";
/// scripts/stack.env's CDC_DATABASE_URL.
pub const DEFAULT_CDC_DATABASE_URL: &str =
    "postgres://chatpipe_cdc:chatpipe-cdc-stack-secret@127.0.0.1:5432/chatpipe";
pub const DEFAULT_REGISTRY_URL: &str = "http://127.0.0.1:8081/apis/ccompat/v7";
pub const JWT_SECRET: &str = "test-secret-test-secret-test-secret!";
const DB_PREFIX: &str = "cp_test_";

/// A metrics recorder of this test's own. Every metric recorded on the test's thread goes
/// to it instead of the process-wide recorder that the other tests of the binary share:
/// the test's runtime is current-thread, so the in-process apps it starts (their
/// handlers, connections and spawned tasks) all record here, and a count read from it is
/// this test's apps' and nobody else's. Hold it for the whole test, started before the
/// apps. What runs on threads of its own (readers, spawn_blocking) still records
/// process-wide: a test that counts there reads PostgreSQL or Kafka instead.
pub struct OwnMetrics {
    handle: chatpipe_core::telemetry::PrometheusHandle,
    _installed: metrics::LocalRecorderGuard<'static>,
}

impl OwnMetrics {
    pub fn start() -> Self {
        assert_eq!(
            tokio::runtime::Handle::current().runtime_flavor(),
            tokio::runtime::RuntimeFlavor::CurrentThread,
            "OwnMetrics needs the test's apps on its thread: a current-thread #[tokio::test]"
        );
        let recorder: &'static _ = Box::leak(Box::new(chatpipe_core::telemetry::recorder()));
        let handle = recorder.handle();
        Self {
            handle,
            _installed: metrics::set_default_local_recorder(recorder),
        }
    }

    /// The sum of `name`'s samples with every one of `labels`, 0 when none was recorded.
    pub fn sum(&self, name: &str, labels: &[&str]) -> f64 {
        metric_sum(&self.handle.render(), name, labels).unwrap_or(0.0)
    }
}

/// The sum of the samples of metric `name` in Prometheus text whose labels include every
/// one of `labels` (`key="value"`); HELP and TYPE lines do not count. `None` when no
/// sample of `name` is there.
pub fn metric_sum(text: &str, name: &str, labels: &[&str]) -> Option<f64> {
    let values: Vec<f64> = text
        .lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            let metric = series.split('{').next()?;
            (metric == name && labels.iter().all(|l| series.contains(l)))
                .then(|| value.parse::<f64>().ok())
                .flatten()
        })
        .collect();
    (!values.is_empty()).then(|| values.iter().sum())
}

pub fn server_url() -> String {
    stack::endpoints().database_url.clone()
}

/// `url` (a database of the test server) as the services reach it: the same database,
/// host and options, logged in as the least-privilege `chatpipe_service`
/// (config/postgres/roles.sql) instead of the superuser the tests use.
pub fn as_service(url: &str) -> String {
    let login = url::Url::parse(&stack::endpoints().service_database_url)
        .expect("the service database URL is a URL");
    let mut url = url::Url::parse(url).expect("a database URL");
    url.set_username(login.username())
        .expect("a URL with a host");
    url.set_password(login.password())
        .expect("a URL with a host");
    url.into()
}

/// Debezium's login (`chatpipe_cdc`, any database of the server) and the CA its TLS is
/// checked against: `CDC_DATABASE_URL` and `STACK_TLS_CA` of `scripts/stack env`.
pub fn cdc_login() -> (String, std::path::PathBuf) {
    let url = std::env::var("CDC_DATABASE_URL").unwrap_or_else(|_| DEFAULT_CDC_DATABASE_URL.into());
    let ca = std::env::var("STACK_TLS_CA")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|_| stack::repo_root().join(".stack/tls/ca.pem"));
    (url, ca)
}

/// Applies the migrations to the database of `url` as its owner (the superuser of `url`),
/// as `ingest-api migrate` does before services start; a migrated database is left as it is.
pub async fn migrate_as_owner(url: &str) {
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .connect(url)
        .await
        .unwrap_or_else(|err| panic!("PostgreSQL is not reachable to migrate: {err}"));
    ingest_api::startup::migrate(&pool)
        .await
        .expect("the migrations apply");
    pool.close().await;
}

/// A fresh database, migrated by its owner; the URL the services use for it
/// ([`as_service`]).
pub async fn migrated_database() -> String {
    let url = fresh_database().await;
    migrate_as_owner(&url).await;
    as_service(&url)
}

pub fn registry_url() -> String {
    stack::endpoints().registry_url.clone()
}

/// `url` with its database name replaced.
pub fn with_database(url: &str, db: &str) -> String {
    let (base, query) = url
        .split_once('?')
        .map_or((url, None), |(b, q)| (b, Some(q)));
    let base = base.rsplit_once('/').map_or(base, |(b, _)| b);
    match query {
        Some(q) => format!("{base}/{db}?{q}"),
        None => format!("{base}/{db}"),
    }
}

async fn admin_connection() -> PgConnection {
    let url = server_url();
    PgConnection::connect(&url).await.unwrap_or_else(|err| {
        panic!(
            "PostgreSQL is not reachable at {url}: {err}\n\
             Start it with `scripts/stack up`, or point DATABASE_URL at a server where this user may CREATE DATABASE."
        )
    })
}

/// Drops databases left by earlier test processes that are gone (a crashed or killed
/// run cannot drop its own). Runs once per process.
async fn drop_stale_databases(admin: &mut PgConnection) {
    static ONCE: tokio::sync::OnceCell<()> = tokio::sync::OnceCell::const_new();
    ONCE.get_or_init(|| async {
        let names: Vec<String> =
            sqlx::query_scalar("SELECT datname FROM pg_database WHERE datname LIKE $1")
                .bind(format!("{DB_PREFIX}%"))
                .fetch_all(&mut *admin)
                .await
                .expect("listing test databases");
        for name in names {
            let pid = name
                .trim_start_matches(DB_PREFIX)
                .split('_')
                .next()
                .and_then(|p| p.parse::<u32>().ok());
            let alive = pid.is_some_and(|p| std::path::Path::new(&format!("/proc/{p}")).exists());
            if !alive {
                let _ = admin
                    .execute(format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)").as_str())
                    .await;
            }
        }
    })
    .await;
}

/// A fresh, empty database on the test server; migrations are applied by the app.
pub async fn fresh_database() -> String {
    watchdog::arm();
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let mut admin = admin_connection().await;
    drop_stale_databases(&mut admin).await;
    let name = format!(
        "{DB_PREFIX}{}_{}_{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed),
        uuid::Uuid::new_v4().simple()
    );
    admin
        .execute(format!("CREATE DATABASE \"{name}\"").as_str())
        .await
        .unwrap_or_else(|err| panic!("CREATE DATABASE {name} failed: {err}"));
    with_database(&server_url(), &name)
}

pub struct TestApp {
    pub base: String,
    /// `http://host:port` of its admin listener (`/metrics`, detailed `/readyz`).
    pub admin: String,
    pub pool: PgPool,
    pub http: reqwest::Client,
    pub keys: TokenKeys,
    /// Decodes what the app wrote to the outbox (the same registered schema).
    pub codec: EventCodec,
    /// The app's send queue, to see what waits in it.
    pub sends: ingest_api::store::send::SendQueue,
}

pub async fn spawn_app() -> TestApp {
    spawn_app_with(|_| {}).await
}

/// A second ingest-api process on `app`'s database, as a deployment runs several.
pub async fn spawn_app_beside(app: &TestApp) -> TestApp {
    let url: String = sqlx::query_scalar("SELECT current_database()")
        .fetch_one(&app.pool)
        .await
        .map(|db: String| with_database(&server_url(), &db))
        .expect("the first app's database");
    spawn_app_with(|s| s.database.url = SecretString::from(url)).await
}

/// Starts ingest-api on 127.0.0.1:0 with the compiled-in defaults, a fresh database and
/// whatever `adjust` changes. Outbox rows are kept (`outbox.retain_until_confirmed`,
/// and no auditor deletes them) so tests can read what each transaction wrote.
pub async fn spawn_app_with(adjust: impl FnOnce(&mut Settings)) -> TestApp {
    let url = fresh_database().await;
    let mut settings = Settings::defaults_with_secret(JWT_SECRET);
    settings.http.addr = "127.0.0.1:0".parse().unwrap();
    settings.admin.addr = "127.0.0.1:0".parse().unwrap();
    settings.database.url = SecretString::from(url.clone());
    settings.database.max_connections = 20;
    // Correctness tests send dozens of requests at once into one row lock while the
    // whole suite runs on a few cores: generous waits keep them from failing on a
    // latency bound. `tests/ingest_api/bounds.rs` sets the bounds low to test them.
    settings.database.acquire_timeout_ms = 20_000;
    settings.http.request_timeout_ms = 30_000;
    settings.registry.url = registry_url();
    settings.outbox.retain_until_confirmed = true;
    // The REST suite tests the direct read path; stream tests switch to the stream.
    settings.reads.mode = ReadMode::Direct;
    settings.kafka.brokers = stream::brokers();
    adjust(&mut settings);
    // `adjust` may point the app at another app's database (a second process). The app
    // connects as the services do, to a database its owner migrated; the test's own pool
    // is the superuser's.
    let url = settings.database.url.expose_secret().to_owned();
    migrate_as_owner(&url).await;
    settings.database.url = SecretString::from(as_service(&url));
    settings.database.migrate_on_start = false;
    let registry = settings.registry.connect().unwrap();
    let codec = registry
        .event_codec_for(&settings.registry.events_subject)
        .await
        .unwrap_or_else(|err| {
            panic!(
                "{err}\nThe schema registry must run: start the stack with `scripts/stack up` \
             or set SCHEMA_REGISTRY_URL."
            )
        });
    let app = Application::build(settings)
        .await
        .expect("ingest-api starts");
    let base = format!("http://{}", app.local_addr());
    let admin = format!("http://{}", app.admin_addr());
    let sends = app.sends();
    tokio::spawn(app.run_until_stopped(std::future::pending()));
    let pool = PgPoolOptions::new()
        .max_connections(4)
        .connect(&url)
        .await
        .expect("test pool");
    let keys = TokenKeys::new(&SecretString::from(JWT_SECRET), Duration::ZERO).unwrap();
    TestApp {
        base,
        admin,
        pool,
        // Far above the app's own request timeout: a request that hangs fails the test
        // with its URL instead of hanging it. Redirects are not followed: a test asking
        // for an unversioned path sees the 308 it gets.
        http: reqwest::Client::builder()
            .timeout(Duration::from_secs(60))
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .expect("HTTP client"),
        keys,
        codec,
        sends,
    }
}

/// A decoded response: status, content type and JSON body (Null when empty).
#[derive(Debug)]
pub struct Resp {
    pub status: u16,
    pub content_type: String,
    pub headers: reqwest::header::HeaderMap,
    pub body: Value,
}

impl Resp {
    #[track_caller]
    pub fn expect(self, status: u16) -> Value {
        assert_eq!(
            self.status, status,
            "unexpected status, body: {}",
            self.body
        );
        self.body
    }

    /// Asserts a problem+json answer with this status; returns the problem.
    #[track_caller]
    pub fn problem(self, status: u16) -> Value {
        assert_eq!(
            self.status, status,
            "unexpected status, body: {}",
            self.body
        );
        assert_eq!(
            self.content_type, "application/problem+json",
            "body: {}",
            self.body
        );
        assert_eq!(self.body["status"], status);
        assert!(self.body["type"]
            .as_str()
            .is_some_and(|t| t.starts_with("/problems/")));
        self.body
    }
}

impl TestApp {
    pub fn token(&self, user: i64) -> String {
        self.keys
            .issue(UserId::new(user).unwrap(), Duration::from_secs(3600))
    }

    pub fn expired_token(&self, user: i64) -> String {
        let now = unix_now();
        self.keys
            .sign(UserId::new(user).unwrap(), now - 7200, now - 3600)
    }

    /// A client acting as `user`.
    pub fn user(&self, user: i64) -> Client<'_> {
        Client {
            app: self,
            auth: Some(format!("Bearer {}", self.token(user))),
        }
    }

    /// A client with this exact Authorization header (or none).
    pub fn with_auth(&self, header: Option<String>) -> Client<'_> {
        Client {
            app: self,
            auth: header,
        }
    }

    /// The events in the outbox, in the order they were written, decoded.
    pub async fn outbox_events(&self) -> Vec<ChatEvent> {
        let payloads: Vec<Vec<u8>> =
            sqlx::query_scalar("SELECT payload FROM outbox ORDER BY created_at, ctid")
                .fetch_all(&self.pool)
                .await
                .expect("reading the outbox");
        payloads
            .iter()
            .map(|p| self.codec.decode(p).expect("outbox payload decodes"))
            .collect()
    }

    pub async fn count(&self, sql: &str) -> i64 {
        sqlx::query_scalar(sql)
            .fetch_one(&self.pool)
            .await
            .expect(sql)
    }

    /// The app's /metrics page. Every app of a test process shares one recorder: compare
    /// readings before and after, not absolute values.
    pub async fn metrics(&self) -> String {
        self.http
            .get(format!("{}/metrics", self.admin))
            .send()
            .await
            .expect("GET /metrics")
            .text()
            .await
            .expect("the /metrics body")
    }

    /// How many times PostgreSQL ran statements whose text contains `fragment` in this
    /// app's database, as `pg_stat_statements` counts them (statements are normalized:
    /// literals become `$n`). The stack preloads the extension.
    pub async fn statement_calls(&self, fragment: &str) -> i64 {
        let mut conn = self.pool.acquire().await.expect("a connection");
        sqlx::query("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            .execute(&mut *conn)
            .await
            .expect("pg_stat_statements is available: scripts/stack up preloads it");
        sqlx::query_scalar(
            "SELECT coalesce(sum(calls), 0)::bigint FROM pg_stat_statements
              WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
                AND strpos(query, $1) > 0",
        )
        .bind(fragment)
        .fetch_one(&mut *conn)
        .await
        .expect("reading pg_stat_statements")
    }

    /// `conversation.membership_version` as PostgreSQL has it: what every event of the
    /// conversation committed from now on carries as its `membershipVersion` header.
    pub async fn membership_version(&self, conversation: i64) -> i64 {
        sqlx::query_scalar("SELECT membership_version FROM conversation WHERE id = $1")
            .bind(conversation)
            .fetch_one(&self.pool)
            .await
            .expect("the conversation's membership version")
    }

    /// `user`'s watermark in `conversation` as PostgreSQL has it; `None` for a non-member
    /// (or while the database is away).
    pub async fn watermark(&self, conversation: i64, user: i64) -> Option<i64> {
        sqlx::query_scalar(
            "SELECT last_read_seq FROM conversation_member WHERE conversation_id = $1 AND user_id = $2",
        )
        .bind(conversation)
        .bind(user)
        .fetch_one(&self.pool)
        .await
        .ok()
    }

    /// `user`'s read and delivered watermarks in `conversation` as PostgreSQL has them.
    pub async fn watermarks(&self, conversation: i64, user: i64) -> (i64, i64) {
        sqlx::query_as(
            "SELECT last_read_seq, last_delivered_seq FROM conversation_member
              WHERE conversation_id = $1 AND user_id = $2",
        )
        .bind(conversation)
        .bind(user)
        .fetch_one(&self.pool)
        .await
        .unwrap_or_else(|e| panic!("user {user}'s watermarks in {conversation}: {e}"))
    }
}

#[derive(Clone)]
pub struct Client<'a> {
    app: &'a TestApp,
    auth: Option<String>,
}

impl Client<'_> {
    pub async fn get(&self, path: &str) -> Resp {
        self.send(self.app.http.get(format!("{}{path}", self.app.base)))
            .await
    }

    pub async fn post(&self, path: &str, body: Value) -> Resp {
        self.send(
            self.app
                .http
                .post(format!("{}{path}", self.app.base))
                .json(&body),
        )
        .await
    }

    /// POST with a raw body and content type, for malformed input.
    pub async fn post_raw(&self, path: &str, content_type: Option<&str>, body: Vec<u8>) -> Resp {
        let mut req = self
            .app
            .http
            .post(format!("{}{path}", self.app.base))
            .body(body);
        if let Some(ct) = content_type {
            req = req.header("content-type", ct);
        }
        self.send(req).await
    }

    pub async fn patch(&self, path: &str, body: Value) -> Resp {
        self.send(
            self.app
                .http
                .patch(format!("{}{path}", self.app.base))
                .json(&body),
        )
        .await
    }

    pub async fn put_json(&self, path: &str, body: Value) -> Resp {
        self.send(
            self.app
                .http
                .put(format!("{}{path}", self.app.base))
                .json(&body),
        )
        .await
    }

    /// PUT without a body.
    pub async fn put(&self, path: &str) -> Resp {
        self.send(self.app.http.put(format!("{}{path}", self.app.base)))
            .await
    }

    pub async fn delete(&self, path: &str) -> Resp {
        self.send(self.app.http.delete(format!("{}{path}", self.app.base)))
            .await
    }

    async fn send(&self, mut req: reqwest::RequestBuilder) -> Resp {
        if let Some(auth) = &self.auth {
            req = req.header("authorization", auth);
        }
        let res = req.send().await.expect("request reaches ingest-api");
        let status = res.status().as_u16();
        let content_type = res
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        let headers = res.headers().clone();
        let bytes = res.bytes().await.expect("response body");
        let body = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes)
                .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into()))
        };
        Resp {
            status,
            content_type,
            headers,
            body,
        }
    }

    // Domain shortcuts used by many tests.

    /// Opens the DIRECT conversation with `peer` (new: 201); returns its id.
    pub async fn open_direct(&self, peer: i64) -> i64 {
        let body = self
            .post("/v1/direct", serde_json::json!({"peerId": peer}))
            .await
            .expect(201);
        body["conversationId"].as_i64().expect("conversationId")
    }

    /// Creates a GROUP with these other members; returns its id.
    pub async fn create_group(&self, members: &[i64]) -> i64 {
        let body = self
            .post(
                "/v1/conversations",
                serde_json::json!({"type": "GROUP", "title": "test", "memberIds": members}),
            )
            .await
            .expect(201);
        body["conversationId"].as_i64().expect("conversationId")
    }

    /// Sends a message with a fresh clientMsgId; returns its seq.
    pub async fn send_message(&self, conversation: i64, body: &str) -> i64 {
        let res = self
            .post(
                &format!("/v1/conversations/{conversation}/messages"),
                serde_json::json!({"clientMsgId": uuid::Uuid::new_v4(), "body": body}),
            )
            .await
            .expect(201);
        res["seq"].as_i64().expect("seq")
    }

    pub async fn mark_read(&self, conversation: i64, seq: i64) -> Value {
        self.post(
            &format!("/v1/conversations/{conversation}/read"),
            serde_json::json!({"seq": seq}),
        )
        .await
        .expect(200)
    }

    /// This user's inbox entry for `conversation` (among their newest 100).
    pub async fn inbox_entry(&self, conversation: i64) -> Value {
        let inbox = self.get("/v1/inbox?limit=100").await.expect(200);
        inbox["conversations"]
            .as_array()
            .expect("conversations")
            .iter()
            .find(|e| e["conversationId"] == conversation)
            .unwrap_or_else(|| panic!("{conversation} in the inbox: {inbox}"))
            .clone()
    }

    /// This user's unread count in `conversation`, as their inbox answers it.
    pub async fn unread_count(&self, conversation: i64) -> i64 {
        self.inbox_entry(conversation).await["unreadCount"]
            .as_i64()
            .expect("unreadCount")
    }
}

/// Opens `n` sockets to `addr` (`host:port`) that send the start of a request's headers
/// and then nothing: slowloris.
pub async fn slow_header_sockets(addr: &str, n: usize) -> Vec<tokio::net::TcpStream> {
    use tokio::io::AsyncWriteExt;
    let mut sockets = Vec::with_capacity(n);
    for _ in 0..n {
        let mut s = tokio::net::TcpStream::connect(addr)
            .await
            .unwrap_or_else(|e| panic!("connecting to {addr}: {e}"));
        s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: ")
            .await
            .expect("half a request");
        sockets.push(s);
    }
    sockets
}

/// Waits until the server has closed every one of `sockets` (a read gives EOF or an
/// error); fails at the deadline saying how many are still open.
pub async fn until_closed(sockets: Vec<tokio::net::TcpStream>, deadline: Duration) {
    use tokio::io::AsyncReadExt;
    let until = tokio::time::Instant::now() + deadline;
    let total = sockets.len();
    let waits = sockets.into_iter().map(|mut s| async move {
        let mut buf = [0u8; 512];
        loop {
            match tokio::time::timeout_at(until, s.read(&mut buf)).await {
                Ok(Ok(0)) | Ok(Err(_)) => return true,
                Ok(Ok(_)) => continue,
                Err(_) => return false,
            }
        }
    });
    let closed = futures::future::join_all(waits)
        .await
        .into_iter()
        .filter(|c| *c)
        .count();
    assert_eq!(
        closed,
        total,
        "{} of {total} sockets still open after {deadline:?}",
        total - closed
    );
}

/// Waits until at least `n` sessions of the app's ingest-api wait for a lock (a row the
/// test holds, say); fails at 20 s saying how many do.
pub async fn until_lock_waiters(app: &TestApp, n: i64) {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let waiting: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity
              WHERE datname = current_database() AND application_name = 'ingest-api'
                AND wait_event_type = 'Lock'",
        )
        .fetch_one(&app.pool)
        .await
        .expect("reading pg_stat_activity");
        if waiting >= n {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{waiting} of {n} sessions wait for a lock"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// What a Prometheus text page lacks for an operator: each metric family (a `# TYPE`
/// line) without a `# HELP` line, and `chatpipe_build_info` if it is not there.
pub fn undescribed_metrics(text: &str) -> Vec<String> {
    let mut typed = std::collections::BTreeSet::new();
    let mut helped = std::collections::BTreeSet::new();
    for line in text.lines() {
        let mut words = line.split_whitespace();
        match (words.next(), words.next(), words.next()) {
            (Some("#"), Some("TYPE"), Some(name)) => typed.insert(name.to_owned()),
            (Some("#"), Some("HELP"), Some(name)) => helped.insert(name.to_owned()),
            _ => continue,
        };
    }
    let mut gaps: Vec<String> = typed
        .difference(&helped)
        .map(|name| format!("{name} has no HELP"))
        .collect();
    if !typed.contains("chatpipe_build_info") {
        gaps.push("no chatpipe_build_info".into());
    }
    gaps
}

/// The counters the alert rules (`docs/prometheus/chatpipe.rules.yml`) read through
/// `rate(` or `increase(` by name. Each must be exported from the start, at 0, by the
/// service that counts it (`chatpipe_core::telemetry::count_from_zero`): a series that
/// appears at its first increment is no increase to Prometheus.
pub fn counters_the_alerts_read() -> std::collections::BTreeSet<String> {
    let path = stack::repo_root().join("docs/prometheus/chatpipe.rules.yml");
    let rules: serde_yaml_ng::Value =
        serde_yaml_ng::from_slice(&std::fs::read(path).unwrap()).expect("the rules are YAML");
    let mut names = std::collections::BTreeSet::new();
    for group in rules["groups"].as_sequence().unwrap() {
        for rule in group["rules"].as_sequence().unwrap() {
            let (Some(_), Some(expr)) = (rule["alert"].as_str(), rule["expr"].as_str()) else {
                continue;
            };
            for call in ["rate(", "increase("] {
                for (at, _) in expr.match_indices(call) {
                    let rest = expr[at + call.len()..].trim_start();
                    let name: String = rest
                        .chars()
                        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == ':')
                        .collect();
                    if name.ends_with("_total") {
                        names.insert(name);
                    }
                }
            }
        }
    }
    names
}

/// The registry's URL through a [`late_port`]: a registry that comes up `after` from now.
pub fn late_registry(after: Duration) -> (String, std::time::Instant) {
    let real = url::Url::parse(&registry_url()).expect("the registry URL");
    let target = format!("{}:{}", real.host_str().unwrap(), real.port().unwrap());
    let (port, opens) = late_port(&target, after);
    (
        registry_url().replace(&target, &format!("127.0.0.1:{port}")),
        opens,
    )
}

/// A port on 127.0.0.1 that turns connections away for `after` (each is closed at once,
/// unanswered), then forwards each one to `target` (`host:port`): the registry or the
/// broker as seen by a service that started before it. Returns the port and when it
/// opens. The port is held from the start: binding it only when it opens lost it, now
/// and then, to another test's socket in between (`AddrInUse`).
pub fn late_port(target: &str, after: Duration) -> (u16, std::time::Instant) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
    listener
        .set_nonblocking(true)
        .expect("a non-blocking listener");
    let port = listener.local_addr().expect("its address").port();
    let opens = std::time::Instant::now() + after;
    let target = target.to_owned();
    tokio::spawn(async move {
        let listener = tokio::net::TcpListener::from_std(listener).expect("the late port");
        while let Ok((mut inbound, _)) = listener.accept().await {
            if std::time::Instant::now() < opens {
                drop(inbound);
                continue;
            }
            let target = target.clone();
            tokio::spawn(async move {
                if let Ok(mut outbound) = tokio::net::TcpStream::connect(&target).await {
                    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                }
            });
        }
    });
    (port, opens)
}

/// The registry as a replica restored from an old backup sees it: for `forget_for` from
/// now, every `GET …/schemas/ids/{id}` answers 404 (Confluent's 40403, "Schema not
/// found"); every other request, and those after, go to the real registry, whose answer
/// comes back as it is.
pub async fn forgetful_registry(forget_for: Duration) -> Forgetful {
    use axum::body::Body;
    use axum::extract::Request;
    use axum::response::{IntoResponse, Response};
    let real = url::Url::parse(&registry_url()).expect("the registry URL");
    let origin = real.origin().ascii_serialization();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a port for the registry's proxy");
    let proxy = format!("http://{}", listener.local_addr().unwrap());
    let remembers = Arc::new(std::sync::Mutex::new(
        std::time::Instant::now() + forget_for,
    ));
    let until = remembers.clone();
    let client = reqwest::Client::new();
    let target = origin.clone();
    let forward = move |req: Request| {
        let (client, target, until) = (client.clone(), target.clone(), until.clone());
        async move {
            let path = req.uri().path_and_query().map(|p| p.as_str().to_owned());
            let path = path.unwrap_or_default();
            let forgets = std::time::Instant::now() < *until.lock().unwrap();
            if path.contains("/schemas/ids/") && forgets {
                let body = r#"{"error_code":40403,"message":"Schema not found"}"#;
                return (axum::http::StatusCode::NOT_FOUND, body).into_response();
            }
            let method = req.method().clone();
            let headers = req.headers().clone();
            let body = axum::body::to_bytes(req.into_body(), 16 << 20)
                .await
                .unwrap_or_default();
            let mut out = client.request(method, format!("{target}{path}")).body(body);
            for (name, value) in &headers {
                if name != axum::http::header::HOST {
                    out = out.header(name, value);
                }
            }
            match out.send().await {
                Ok(res) => {
                    let mut answer = Response::builder().status(res.status().as_u16());
                    for (name, value) in res.headers() {
                        let hop = ["transfer-encoding", "connection", "content-length"];
                        if !hop.contains(&name.as_str()) {
                            answer = answer.header(name.as_str(), value.as_bytes());
                        }
                    }
                    let bytes = res.bytes().await.unwrap_or_default();
                    answer.body(Body::from(bytes)).unwrap()
                }
                Err(_) => axum::http::StatusCode::BAD_GATEWAY.into_response(),
            }
        }
    };
    let app = axum::Router::new().fallback(forward);
    tokio::spawn(async move { axum::serve(listener, app).await });
    Forgetful {
        url: registry_url().replacen(&origin, &proxy, 1),
        remembers,
    }
}

/// A [`forgetful_registry`]: its URL, and when it knows the ids again.
pub struct Forgetful {
    pub url: String,
    remembers: Arc<std::sync::Mutex<std::time::Instant>>,
}

impl Forgetful {
    /// From now on it answers as the registry does.
    pub fn remember(&self) {
        *self.remembers.lock().unwrap() = std::time::Instant::now();
    }

    pub fn remembers_at(&self) -> std::time::Instant {
        *self.remembers.lock().unwrap()
    }
}

#[cfg(test)]
mod metric_text {
    #[test]
    fn a_family_without_help_and_a_missing_build_info_are_named() {
        let text = "# HELP a_total A.\n# TYPE a_total counter\na_total 1\n\
                    # TYPE b_seconds histogram\nb_seconds_bucket{le=\"1\"} 0\n";
        assert_eq!(
            super::undescribed_metrics(text),
            ["b_seconds has no HELP", "no chatpipe_build_info"]
        );
        let described = "# HELP chatpipe_build_info B.\n# TYPE chatpipe_build_info gauge\n";
        assert!(super::undescribed_metrics(described).is_empty());
    }
}
