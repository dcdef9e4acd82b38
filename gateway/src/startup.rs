//! Starting the gateway: its producers and schemas, the deliveries reader, the tasks
//! under one supervisor, and the listeners.

use std::time::Duration;

use anyhow::Context;
use chatpipe_core::kafka::CreateGuarded;
use chatpipe_core::startup::wait_for;
use chatpipe_runtime::{
    CancellationToken, Reader, ReaderSpec, ReaderThread, Readiness, Source, Supervisor,
};
use chatpipe_schemas::registry::{incompatible, Registry};

use crate::configuration::{DeliveriesSettings, Settings};
use crate::routes::Gateway;
use crate::sessions::Sessions;
use crate::{deliveries, presence, resync, signals};

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
    let publisher = presence_publisher(&settings, &registry).await?;
    let signals = client_signals(&settings, &registry).await?;
    let sessions = Sessions::new(settings.sessions.queue_bound).with_caps(
        settings.sessions.max_sessions,
        settings.sessions.max_sessions_per_user,
    );
    let readiness = Readiness::default();
    let (lists_tx, lists_rx) =
        tokio::sync::mpsc::channel(settings.deliveries.max_pending_lists.max(1));
    let (thread, reader) = deliveries_reader(&settings, &registry, &readiness, lists_tx).await?;

    let stop = stop_on(shutdown);
    let mut supervisor = Supervisor::new(stop.clone());
    supervisor.spawn_thread("deliveries", move |stop| {
        let ran = reader.run(&stop);
        drop(thread); // its runtime ends after the reader
        ran
    });
    supervisor.spawn_async("push", {
        let sessions = sessions.clone();
        async move {
            deliveries::push(lists_rx, sessions).await;
            Ok(())
        }
    });
    {
        let sessions = sessions.clone();
        let stop = stop.clone().cancelled_owned();
        supervisor.spawn_async("presence", async move {
            publisher.run(sessions.clone(), stop).await;
            // The connections close on the stop signal; their tombstones go out last.
            let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
            while !sessions.counts().is_empty() && tokio::time::Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            let mut last = sessions.take_changes();
            last.extend(sessions.counts().into_iter().map(|(u, _)| (u, 0)));
            publisher.publish(&last, &sessions).await;
            Ok(())
        });
    }
    {
        let (readiness, sessions) = (readiness.clone(), sessions.clone());
        let stop = stop.clone().cancelled_owned();
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
        shutdown: stop.clone(),
        signals,
    };
    serve(&settings, &mut supervisor, gateway, (listener, admin), stop)?;
    supervisor.wait().await
}

/// The presence publisher, once the presence schema is registered (a gateway started
/// before the registry waits for it, `registry.startup_wait_ms`).
async fn presence_publisher(
    settings: &Settings,
    registry: &Registry,
) -> anyhow::Result<presence::Publisher> {
    let presence_subject = format!("{}-value", settings.presence.topic);
    let codec = wait_for(
        "registering the presence schema",
        settings.registry.startup_wait(),
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
    Ok(presence::Publisher {
        producer,
        codec,
        topic: settings.presence.topic.clone(),
        gateway_id: settings.gateway.id.clone(),
        partition: settings.deliveries.partition,
        lease: Duration::from_millis(settings.presence.lease_ms),
        renew: Duration::from_millis(settings.presence.renew_ms),
    })
}

/// Where clients' `ack` and `typing` frames go: a producer and the two schemas.
async fn client_signals(
    settings: &Settings,
    registry: &Registry,
) -> anyhow::Result<signals::Signals> {
    let patience = settings.registry.startup_wait();
    let sig = &settings.signals;
    let acks_subject = format!("{}-value", sig.acks_topic);
    let ephemeral_subject = format!("{}-value", sig.ephemeral_topic);
    Ok(signals::Signals {
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
    })
}

/// The reader of this gateway's chat.deliveries partition, feeding `lists`, and the
/// reader thread it runs on ([`ReaderThread`], as every processor's reader). It looks up
/// where its partition ends, so the broker must answer (waited for up to
/// `registry.startup_wait_ms`); a partition that does not exist is refused.
async fn deliveries_reader(
    settings: &Settings,
    registry: &Registry,
    readiness: &Readiness,
    lists: tokio::sync::mpsc::Sender<deliveries::Traced>,
) -> anyhow::Result<(ReaderThread, Reader<deliveries::Pusher>)> {
    let patience = settings.registry.startup_wait();
    let d = settings.deliveries.clone();
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
    let health = readiness.reader(
        &spec.name,
        "gateway_deliveries",
        settings.readers.stall_after(),
    );
    let client = settings
        .kafka
        .client()
        .set("fetch.wait.max.ms", "50")
        .clone();
    let thread = ReaderThread::new(client, registry.clone(), health, &settings.readers)?;
    // librdkafka blocks while it asks, and the thread's runtime is dropped off the async
    // workers if this fails: all of it on a blocking thread.
    tokio::task::spawn_blocking(move || {
        let started = thread.handle().block_on(wait_for(
            "starting the deliveries reader",
            patience,
            || async {
                let reader = thread
                    .reader(
                        spec.clone(),
                        deliveries::Pusher {
                            lists: lists.clone(),
                        },
                    )
                    .and_then(|reader| check_partition(&reader, &d).map(|()| reader));
                reader.map_err(|e| format!("{e:#}"))
            },
            |_| false,
        ));
        let reader = started.map_err(anyhow::Error::msg)?;
        Ok((thread, reader))
    })
    .await?
}

/// The stop of every task and connection: cancelled by `shutdown` (SIGTERM), or by the
/// supervisor when a task ended on its own.
fn stop_on(shutdown: impl std::future::Future<Output = ()> + Send + 'static) -> CancellationToken {
    let stop = CancellationToken::new();
    let on_shutdown = stop.clone();
    tokio::spawn(stop.clone().run_until_cancelled_owned(async move {
        shutdown.await;
        on_shutdown.cancel();
    }));
    stop
}

/// `/ws` (under the supervisor, with the connection limits of `http.*`) and the admin
/// endpoints, both until the stop.
fn serve(
    settings: &Settings,
    supervisor: &mut Supervisor,
    gateway: Gateway,
    (listener, admin): (tokio::net::TcpListener, tokio::net::TcpListener),
    stop: CancellationToken,
) -> anyhow::Result<()> {
    tracing::info!(
        addr = %listener.local_addr()?,
        id = %settings.gateway.id,
        partition = settings.deliveries.partition,
        "gateway listening"
    );
    let admin_stop = stop.clone().cancelled_owned();
    let admin_router = chatpipe_runtime::http::router(gateway.readiness.clone());
    tokio::spawn(chatpipe_core::http::serve(
        admin,
        admin_router,
        chatpipe_core::http::ConnectionLimits::ADMIN,
        admin_stop,
    ));
    let server_stop = stop.cancelled_owned();
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
    Ok(())
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
