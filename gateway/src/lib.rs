//! The WebSocket gateway. Clients connect to `GET /ws` with the same JWT as the REST
//! API; the gateway keeps a session per connection (several per user), tells
//! chat.presence which users it holds ([`presence`]), and pushes the fanout lists of its
//! chat.deliveries partition to them ([`deliveries`]).

pub mod client;
pub mod connection;
pub mod deliveries;
pub mod presence;
pub mod resync;
pub mod sessions;
pub mod signals;

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use anyhow::Context;
use axum::extract::ws::{CloseFrame, Message, WebSocket, WebSocketUpgrade};
use axum::extract::State;
use axum::http::{header, HeaderMap};
use axum::response::Response;
use axum::routing::get;
use axum::Router;
use chatpipe_core::auth::{unix_now, AuthError, AuthSettings, TokenKeys, Verified};
use chatpipe_core::config::{KafkaSettings, RegistrySettings};
use chatpipe_core::kafka::CreateGuarded;
use chatpipe_core::startup::wait_for;
use chatpipe_runtime::{
    Reader, ReaderSettings, ReaderSpec, Readiness, Source, Supervisor, WriterSchemas,
};
use chatpipe_schemas::registry::incompatible;
use futures::StreamExt;
use serde::Deserialize;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

pub use sessions::Sessions;

const DEFAULTS: &str = include_str!("../../config/gateway.toml");
pub const ALIASES: &[(&str, &str)] = &[
    ("GATEWAY_ADDR", "http.addr"),
    ("GATEWAY_ADMIN_ADDR", "admin.addr"),
    ("GATEWAY_ID", "gateway.id"),
    ("JWT_SECRET", "auth.jwt_secret"),
    ("KAFKA_BROKERS", "kafka.brokers"),
    ("SCHEMA_REGISTRY_URL", "registry.url"),
];

/// Browsers cannot set headers on a WebSocket: they offer the token as a subprotocol,
/// `Sec-WebSocket-Protocol: chatpipe, bearer.<JWT>`; the gateway answers `chatpipe`.
pub const SUBPROTOCOL: &str = "chatpipe";
const TOKEN_PROTOCOL_PREFIX: &str = "bearer.";

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    pub http: HttpSettings,
    pub admin: chatpipe_core::config::AdminSettings,
    pub gateway: GatewaySettings,
    pub auth: AuthSettings,
    pub sessions: SessionSettings,
    pub kafka: KafkaSettings,
    pub registry: RegistrySettings,
    pub presence: PresenceSettings,
    pub deliveries: DeliveriesSettings,
    pub signals: SignalSettings,
    pub readers: ReaderSettings,
}

/// Where what clients say over the socket goes (`signals.rs`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SignalSettings {
    /// `ack` frames (delivered ticks): `chat.delivery-acks`.
    pub acks_topic: String,
    /// `typing` frames: `chat.ephemeral`.
    pub ephemeral_topic: String,
    /// At most one typing signal per conversation per this long leaves a connection
    /// (fanout throttles per user to its own interval).
    pub typing_interval_ms: u64,
    /// How long a signal may wait for the broker before it is given up (acks are
    /// cumulative: the next covers it; typing late is worth nothing).
    pub produce_timeout_ms: u64,
    /// Text frames one connection may send: past it, it is closed (1008 "too many frames").
    pub frames: signals::FrameBucket,
    /// A conversation's acks leave a connection at most once per this long, the highest
    /// seq of those held back.
    pub ack_interval_ms: u64,
    /// Signals waiting for the broker, all connections together (the producer's queue):
    /// past it, new ones are dropped (gateway_acks_total{result="dropped"}).
    pub queue_max_messages: u32,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GatewaySettings {
    pub id: String,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PresenceSettings {
    pub topic: String,
    pub lease_ms: u64,
    pub renew_ms: u64,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeliveriesSettings {
    pub topic: String,
    pub partition: i32,
    pub max_pending_lists: usize,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpSettings {
    pub addr: SocketAddr,
    pub header_read_timeout_ms: u64,
    pub max_connections: usize,
    pub max_connections_per_ip: usize,
    pub refusing_at_once: usize,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionSettings {
    pub queue_bound: usize,
    pub heartbeat_ms: u64,
    pub socket_send_buffer_bytes: u32,
    pub read_buffer_bytes: usize,
    pub max_client_message_bytes: usize,
    pub max_sessions: usize,
    pub max_sessions_per_user: usize,
}

impl Settings {
    pub fn load(file: Option<&Path>) -> Result<Self, Box<figment::Error>> {
        chatpipe_core::config::load(DEFAULTS, file, ALIASES)
    }
}

/// Runs a gateway on `listener` until `shutdown` resolves: registers the presence
/// schema, reads its chat.deliveries partition, publishes presence, serves `/ws`. On
/// shutdown, queued frames go out, connections close with 1001, and the users' presence
/// tombstones are written before it returns. Every task runs under one supervisor: if
/// one ends on its own (the deliveries reader failing, say), the gateway shuts down the
/// same way and returns the error, so the process exits non-zero.
pub async fn run(
    settings: Settings,
    listener: tokio::net::TcpListener,
    admin: tokio::net::TcpListener,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let keys = settings.auth.token_keys()?;
    keys.start();
    let registry = settings.registry.connect()?;
    // A gateway started before the registry or the broker waits for them.
    let patience = settings.registry.startup_wait();
    let presence_subject = format!("{}-value", settings.presence.topic);
    let codec = wait_for(
        "registering the presence schema",
        patience,
        || registry.presence_codec_for(&presence_subject),
        incompatible,
    )
    .await
    .context("registering the presence schema")?;
    // A presence record older than a lease is worth nothing: librdkafka gives up on it
    // then, rather than after its default five minutes. Not idempotent: an idempotent
    // producer whose in-flight records time out must drain them and bump its epoch before
    // it sends again, which after a broker stall can outlast a lease; a renewal written
    // twice is harmless. One request in flight keeps each user's records in order.
    let producer: chatpipe_core::kafka::FutureProducer = settings
        .kafka
        .producer()
        .set("message.timeout.ms", settings.presence.lease_ms.to_string())
        .set("enable.idempotence", "false")
        .set("max.in.flight.requests.per.connection", "1")
        .create_guarded()
        .context("creating the Kafka producer")?;
    let sig = &settings.signals;
    let acks_subject = format!("{}-value", sig.acks_topic);
    let ephemeral_subject = format!("{}-value", sig.ephemeral_topic);
    let signals = signals::Signals {
        producer: settings
            .kafka
            .producer()
            .set("message.timeout.ms", sig.produce_timeout_ms.to_string())
            .set(
                "queue.buffering.max.messages",
                sig.queue_max_messages.to_string(),
            )
            .create_guarded()
            .context("creating the Kafka producer of client signals")?,
        acks_codec: wait_for(
            "registering the acks' schema",
            patience,
            || registry.receipt_codec_for(&acks_subject),
            incompatible,
        )
        .await
        .context("registering the acks' schema")?,
        acks_topic: sig.acks_topic.clone(),
        ephemeral_codec: wait_for(
            "registering the chat.ephemeral schema",
            patience,
            || registry.ephemeral_codec_for(&ephemeral_subject),
            incompatible,
        )
        .await
        .context("registering the chat.ephemeral schema")?,
        ephemeral_topic: sig.ephemeral_topic.clone(),
        typing_interval: Duration::from_millis(sig.typing_interval_ms),
        frames: sig.frames,
        ack_interval: Duration::from_millis(sig.ack_interval_ms),
    };
    let sessions = Sessions::new(settings.sessions.queue_bound).with_caps(
        settings.sessions.max_sessions,
        settings.sessions.max_sessions_per_user,
    );
    let readiness = Readiness::default();
    let d = &settings.deliveries;
    let spec = ReaderSpec {
        name: format!("deliveries-{}", d.partition),
        metric: "gateway_deliveries",
        topic: d.topic.clone(),
        source: Source::Assigned {
            partition: Some(d.partition),
            start: rdkafka::Offset::End,
        },
        dead_letters: Some(format!("{}.dlq", d.topic)),
        max_poll: Duration::from_millis(100),
        commit_every: settings.readers.commit_interval(),
        settings: settings.readers.clone(),
    };
    let (lists_tx, lists_rx) = tokio::sync::mpsc::channel(d.max_pending_lists.max(1));
    let health = readiness.reader(
        &spec.name,
        "gateway_deliveries",
        settings.readers.stall_after(),
    );
    // The reader looks up where its partition ends: the broker must answer.
    let reader = wait_for(
        "starting the deliveries reader",
        patience,
        || {
            // librdkafka blocks while it asks: off the async workers.
            let (spec, lists, registry, health, d) = (
                spec.clone(),
                lists_tx.clone(),
                registry.clone(),
                health.clone(),
                d.clone(),
            );
            let client = settings
                .kafka
                .client()
                .set("fetch.wait.max.ms", "50")
                .clone();
            let handle = tokio::runtime::Handle::current();
            async move {
                tokio::task::spawn_blocking(move || {
                    let reader = Reader::new(
                        spec,
                        client,
                        deliveries::Pusher { lists },
                        WriterSchemas::new(registry, handle.clone()),
                        health,
                        handle,
                    )?;
                    check_partition(&reader, &d)?;
                    anyhow::Ok(reader)
                })
                .await
                .map_err(|e| format!("{e}"))?
                .map_err(|e| format!("{e:#}"))
            }
        },
        |_| false,
    )
    .await
    .map_err(anyhow::Error::msg)?;
    drop(lists_tx);
    let publisher = presence::Publisher {
        producer,
        codec,
        topic: settings.presence.topic.clone(),
        gateway_id: settings.gateway.id.clone(),
        partition: settings.deliveries.partition,
        lease: Duration::from_millis(settings.presence.lease_ms),
        renew: Duration::from_millis(settings.presence.renew_ms),
    };

    let stop = Arc::new(AtomicBool::new(false));
    let mut supervisor = Supervisor::new(stop.clone());
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let stopped = |rx: tokio::sync::watch::Receiver<bool>| async move {
        let mut rx = rx;
        let _ = rx.wait_for(|s| *s).await;
    };
    // The stop: SIGTERM, or a task that ended on its own (the supervisor sets the flag).
    {
        let stop = stop.clone();
        tokio::spawn(async move {
            tokio::select! {
                () = shutdown => {}
                () = async { while !stop.load(Ordering::Relaxed) { tokio::time::sleep(Duration::from_millis(50)).await } } => {}
            }
            stop.store(true, Ordering::Relaxed);
            let _ = stop_tx.send(true);
        });
    }
    supervisor.spawn_thread("deliveries", move |stop| reader.run(&stop));
    supervisor.spawn_async("push", {
        let sessions = sessions.clone();
        async move {
            deliveries::push(lists_rx, sessions).await;
            Ok(())
        }
    });
    {
        let sessions = sessions.clone();
        let stop = stopped(stop_rx.clone());
        supervisor.spawn_async("presence", async move {
            publisher.run(sessions.clone(), stop).await;
            // The connections close on the stop signal; their tombstones go out last.
            let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
            while !sessions.counts().is_empty() && tokio::time::Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            let mut last = sessions.take_changes();
            last.extend(sessions.counts().into_iter().map(|(u, _)| (u, 0)));
            publisher.publish(&last).await;
            Ok(())
        });
    }
    {
        let (readiness, sessions) = (readiness.clone(), sessions.clone());
        let stop = stopped(stop_rx.clone());
        supervisor.spawn_async("resync", async move {
            resync::watch_readers(readiness, sessions, Duration::from_secs(1), stop).await;
            Ok(())
        });
    }
    let gateway = Gateway {
        keys,
        sessions,
        readiness,
        heartbeat: Duration::from_millis(settings.sessions.heartbeat_ms),
        read_buffer_bytes: settings.sessions.read_buffer_bytes,
        max_client_message_bytes: settings.sessions.max_client_message_bytes,
        shutdown: stop_rx.clone(),
        signals,
    };
    tracing::info!(
        addr = %listener.local_addr()?,
        id = %settings.gateway.id,
        partition = settings.deliveries.partition,
        "gateway listening"
    );
    let admin_stop = stopped(stop_rx.clone());
    let admin_router = chatpipe_runtime::http::router(gateway.readiness.clone());
    tokio::spawn(chatpipe_core::http::serve(
        admin,
        admin_router,
        chatpipe_core::http::ConnectionLimits::ADMIN,
        admin_stop,
    ));
    let server_stop = stopped(stop_rx);
    let limits = chatpipe_core::http::ConnectionLimits {
        header_read_timeout_ms: settings.http.header_read_timeout_ms,
        max_connections: settings.http.max_connections,
        max_connections_per_ip: settings.http.max_connections_per_ip,
        refusing_at_once: settings.http.refusing_at_once,
    };
    supervisor.spawn_async("http", async move {
        chatpipe_core::http::serve(listener, gateway.router(), limits, server_stop)
            .await
            .context("serving /ws")
    });
    supervisor.wait().await
}

/// A listener whose connections have a send buffer of `sessions.socket_send_buffer_bytes`
/// (accepted sockets inherit it): the memory a stalled client can pin in the kernel is
/// bounded, and a client that stops reading backs up into its session queue, where the
/// overflow rule sees it.
pub fn listener(settings: &Settings) -> std::io::Result<tokio::net::TcpListener> {
    let addr = settings.http.addr;
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.set_send_buffer_size(settings.sessions.socket_send_buffer_bytes)?;
    socket.bind(addr)?;
    socket.listen(1024)
}

/// The admin listener, on `admin.addr`.
pub async fn admin_listener(settings: &Settings) -> anyhow::Result<tokio::net::TcpListener> {
    tokio::net::TcpListener::bind(settings.admin.addr)
        .await
        .with_context(|| format!("binding {} (admin.addr)", settings.admin.addr))
}

/// The configured partition must exist: a gateway reading nothing would look healthy.
fn check_partition<P: chatpipe_runtime::Processor>(
    reader: &Reader<P>,
    d: &DeliveriesSettings,
) -> anyhow::Result<()> {
    let partitions = reader.partitions()?.len();
    anyhow::ensure!(
        d.partition >= 0 && (d.partition as usize) < partitions,
        "deliveries.partition {} does not exist: {} has {partitions} partitions (one per gateway)",
        d.partition,
        d.topic
    );
    Ok(())
}

#[derive(Clone)]
pub struct Gateway {
    pub keys: TokenKeys,
    pub sessions: Sessions,
    /// The deliveries reader's state, for `/readyz`.
    pub readiness: Readiness,
    pub heartbeat: Duration,
    /// Per-connection read buffer: clients only send control frames, so a small one
    /// keeps an idle connection cheap.
    pub read_buffer_bytes: usize,
    /// The largest message a client may send; larger closes the connection.
    pub max_client_message_bytes: usize,
    pub shutdown: tokio::sync::watch::Receiver<bool>,
    /// Where clients' `ack` and `typing` frames go.
    pub signals: signals::Signals,
}

impl Gateway {
    /// The public routes: `/ws`, `/healthz`, and `/readyz` saying only ready (200) or
    /// stalled (503). Which reader stalled and the metrics are on the admin listener.
    pub fn router(self) -> Router {
        let readiness = self.readiness.clone();
        Router::new()
            .route("/ws", get(ws))
            .with_state(self)
            .route(
                "/healthz",
                get(|| async { axum::Json(serde_json::json!({"status": "ok"})) }),
            )
            .route(
                "/readyz",
                get(move || {
                    let stalled = readiness.report().iter().any(|r| r.stalled);
                    let (status, word) = if stalled {
                        (axum::http::StatusCode::SERVICE_UNAVAILABLE, "stalled")
                    } else {
                        (axum::http::StatusCode::OK, "ready")
                    };
                    std::future::ready((status, axum::Json(serde_json::json!({"status": word}))))
                }),
            )
    }
}

/// Whom a connection request authenticates as, and until when: the `Authorization`
/// header, or a `bearer.<JWT>` subprotocol.
async fn authenticate(keys: &TokenKeys, headers: &HeaderMap) -> Result<Verified, AuthError> {
    if let Some(value) = headers.get(header::AUTHORIZATION) {
        return keys.verify_header_until_fresh(value.to_str().ok()).await;
    }
    let offered = headers
        .get(header::SEC_WEBSOCKET_PROTOCOL)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    let token = offered
        .split(',')
        .map(str::trim)
        .find_map(|p| p.strip_prefix(TOKEN_PROTOCOL_PREFIX));
    match token {
        Some(token) => keys.verify_until_fresh(token).await,
        None => Err(AuthError::Missing),
    }
}

/// Closes a freshly upgraded socket with `code` and `reason` (cut to the 123 bytes a
/// close frame holds).
async fn close_at_once(mut socket: WebSocket, code: u16, reason: &str) {
    let mut end = reason.len().min(123);
    while !reason.is_char_boundary(end) {
        end -= 1;
    }
    let frame = CloseFrame {
        code,
        reason: reason[..end].into(),
    };
    let _ = tokio::time::timeout(
        Duration::from_secs(5),
        socket.send(Message::Close(Some(frame))),
    )
    .await;
}

/// `GET /ws`. A refused token still gets the upgrade, then a close with 4001 and the
/// reason: a browser sees nothing of a 401 before the upgrade (only 1006).
async fn ws(State(gw): State<Gateway>, headers: HeaderMap, upgrade: WebSocketUpgrade) -> Response {
    let upgrade = upgrade.protocols([SUBPROTOCOL]);
    let token = match authenticate(&gw.keys, &headers).await {
        Ok(token) => token,
        Err(err) => {
            metrics::counter!("gateway_auth_refusals_total").increment(1);
            let reason = err.to_string();
            return upgrade.on_upgrade(move |socket| async move {
                close_at_once(socket, connection::CLOSE_UNAUTHORIZED, &reason).await;
            });
        }
    };
    let user = token.user;
    let expires_in = Duration::from_secs(token.expires_at.saturating_sub(unix_now()));
    upgrade
        .read_buffer_size(gw.read_buffer_bytes)
        // Frames are written (and flushed) one by one as they leave the queue.
        .write_buffer_size(0)
        .max_message_size(gw.max_client_message_bytes)
        .max_frame_size(gw.max_client_message_bytes)
        .on_upgrade(move |socket| async move {
            let mut session = match gw.sessions.join(user) {
                Ok(session) => session,
                Err(full) => {
                    let reason = format!("{full}; retry");
                    close_at_once(socket, connection::CLOSE_TRY_AGAIN_LATER, &reason).await;
                    return;
                }
            };
            // An `exp` far ahead (allowed only without auth.max_lifetime_secs) is no
            // deadline at all, rather than an Instant that overflows.
            session.token_expires = tokio::time::Instant::now().checked_add(expires_in);
            let id = session.id;
            let (sink, stream) = socket.split();
            let mut stop = gw.shutdown.clone();
            let shutdown = async move {
                let _ = stop.wait_for(|s| *s).await;
            };
            let signals = gw.signals.connection(user);
            let ended =
                connection::serve_with(sink, stream, session, gw.heartbeat, shutdown, signals)
                    .await;
            gw.sessions.leave(user, id);
            tracing::debug!(%user, session = id, ?ended, "connection ended");
        })
}
