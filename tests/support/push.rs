//! Push-path harness: a fanout processor and gateways for a test's namespace, and a
//! WebSocket client. Topics `<ns>.chat.presence` (compacted) and `<ns>.chat.deliveries`
//! (one partition per gateway) are created by [`crate::stream::spawn_pipeline`].

use chatpipe_core::kafka::CreateGuarded;
use std::sync::Arc;
use std::time::{Duration, Instant};

use chatpipe_core::UserId;
use futures::{SinkExt, StreamExt};
use serde_json::Value;
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

use crate::stream::{brokers, Pipeline};
use crate::{registry_url, JWT_SECRET};
use chatpipe_schemas::notification::Notification;

/// Partitions of `<ns>.chat.deliveries`: gateways in one test use distinct ones.
pub const DELIVERY_PARTITIONS: i32 = 2;

/// Fanout's load of a conversation's members from PostgreSQL, as pg_stat_statements
/// shows its text (pipeline/src/fanout/events.rs, `load_members`): count it with
/// [`crate::TestApp::statement_calls`].
pub const FANOUT_MEMBERS_LOAD: &str = "SELECT c.membership_version, m.user_id";

impl Pipeline {
    pub fn presence_topic(&self) -> String {
        format!("{}.chat.presence", self.ns)
    }

    pub fn deliveries_topic(&self) -> String {
        format!("{}.chat.deliveries", self.ns)
    }

    /// Settings for a fanout processor of this namespace.
    pub fn fanout_settings(&self) -> pipeline::settings::Settings {
        let mut s = self.receipts_settings();
        s.fanout.events_topic = self.topic.clone();
        s.fanout.group = format!("{}-fanout", self.ns);
        s.fanout.presence_topic = self.presence_topic();
        s.fanout.deliveries_topic = self.deliveries_topic();
        s.fanout.changelog_topic = format!("{}.chat.fanout-members", self.ns);
        s.fanout.ephemeral_topic = self.ephemeral_topic.clone();
        s.fanout.typing_group = format!("{}-typing", self.ns);
        s
    }

    pub fn notifications_topic(&self) -> String {
        format!("{}.chat.notifications", self.ns)
    }

    /// Settings for a notifications processor of this namespace (reading presence as
    /// fanout would).
    pub fn notification_settings(&self) -> pipeline::settings::Settings {
        let mut s = self.fanout_settings();
        s.notifications.events_topic = self.topic.clone();
        s.notifications.group = format!("{}-notifications", self.ns);
        s.notifications.topic = self.notifications_topic();
        s
    }

    /// Runs a notifications processor in this process until the handle is dropped (a
    /// [`FanoutProcessor`] handle: its status is the processor's presence table).
    pub fn start_notifications(&self, settings: pipeline::settings::Settings) -> FanoutProcessor {
        FanoutProcessor::start(settings, pipeline::notify::run_with)
    }

    /// Every record on this namespace's notifications topic up to its end offsets as
    /// they are now (the broker's high watermarks): (key, record).
    pub async fn notifications_all(&self, deadline: Duration) -> Vec<(String, Notification)> {
        use rdkafka::consumer::{BaseConsumer, Consumer};
        let topic = self.notifications_topic();
        let client: BaseConsumer<chatpipe_core::kafka::Guarded> =
            chatpipe_core::kafka::consumer_config(&brokers(), "notifications-ends")
                .create_guarded()
                .expect("Kafka client");
        let ends: Vec<(i32, i64)> = (0..2)
            .map(|p| {
                let (_, high) = client
                    .fetch_watermarks(&topic, p, deadline)
                    .expect("the topic's end offsets");
                (p, high)
            })
            .collect();
        let mut seen: std::collections::HashMap<i32, i64> = Default::default();
        self.read_notifications(deadline, |_, at| {
            if let Some((p, o)) = at {
                seen.insert(p, o + 1);
            }
            ends.iter()
                .all(|(p, end)| seen.get(p).copied().unwrap_or(0) >= *end)
        })
        .await
    }

    /// The records on this namespace's notifications topic, read from the start with the
    /// writer schemas the registry gives, until `done` says so (fails at the deadline
    /// with what it read): (key, record).
    pub async fn notifications_until(
        &self,
        deadline: Duration,
        mut done: impl FnMut(&[(String, Notification)]) -> bool,
    ) -> Vec<(String, Notification)> {
        self.read_notifications(deadline, |records, _| done(records))
            .await
    }

    /// Reads the notifications topic from the start until `done` (given what was read and
    /// the position of the last record, none before the first) says so.
    async fn read_notifications(
        &self,
        deadline: Duration,
        mut done: impl FnMut(&[(String, Notification)], Option<(i32, i64)>) -> bool,
    ) -> Vec<(String, Notification)> {
        use chatpipe_core::kafka::StreamConsumer;
        use rdkafka::consumer::Consumer;
        use rdkafka::Message as _;
        let topic = self.notifications_topic();
        let consumer: StreamConsumer = chatpipe_core::kafka::consumer_config(
            &brokers(),
            &format!("{topic}-read-{}", uuid::Uuid::new_v4()),
        )
        .create_guarded()
        .expect("Kafka consumer");
        consumer.subscribe(&[&topic]).expect("subscribe");
        let registry = chatpipe_schemas::registry::Registry::new(&registry_url(), deadline)
            .expect("registry client");
        let until = tokio::time::Instant::now() + deadline;
        let mut records = Vec::new();
        let mut at = None;
        while !done(&records, at) {
            let m = tokio::time::timeout_at(until, consumer.recv())
                .await
                .unwrap_or_else(|_| {
                    panic!(
                        "{} notifications on {topic} after {deadline:?}: {records:?}",
                        records.len()
                    )
                })
                .expect("consuming the notifications topic");
            let key = String::from_utf8_lossy(m.key().expect("keyed by user")).into_owned();
            let bytes = m.payload().expect("notifications have values");
            let (id, _) = chatpipe_schemas::avro::split_frame(bytes).expect("framed Avro");
            let writer = registry.writer_schema(id).await.expect("the writer schema");
            records.push((
                key,
                Notification::decode_with(&writer, bytes).expect("a notification"),
            ));
            at = Some((m.partition(), m.offset()));
        }
        crate::stream::close_consumer(consumer, "notifications").await;
        records
    }

    /// Runs a fanout processor in this process until the handle is dropped.
    pub fn start_fanout(&self, settings: pipeline::settings::Settings) -> FanoutProcessor {
        FanoutProcessor::start(settings, pipeline::fanout::run_with)
    }

    /// Settings for gateway `id` reading `partition` of this namespace's deliveries, with
    /// short presence leases (3 s, renewed every second).
    pub fn gateway_settings(&self, id: &str, partition: i32) -> gateway::Settings {
        let mut s = gateway::Settings::load(None).expect("gateway defaults");
        s.http.addr = "127.0.0.1:0".parse().unwrap();
        s.admin.addr = "127.0.0.1:0".parse().unwrap();
        s.gateway.id = format!("{}-{id}", self.ns);
        s.auth.jwt_secret = Some(JWT_SECRET.to_owned().into());
        s.kafka.brokers = brokers();
        s.registry.url = registry_url();
        s.presence.topic = self.presence_topic();
        s.presence.lease_ms = 3_000;
        s.presence.renew_ms = 1_000;
        s.deliveries.topic = self.deliveries_topic();
        s.deliveries.partition = partition;
        s.signals.acks_topic = self.acks_topic.clone();
        s.signals.ephemeral_topic = self.ephemeral_topic.clone();
        s
    }

    /// Runs a gateway in this process on a free port.
    pub async fn start_gateway(&self, settings: gateway::Settings) -> RunningGateway {
        let listener = gateway::listener(&settings).expect("binding the gateway");
        let admin = gateway::admin_listener(&settings).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let admin_addr = admin.local_addr().unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(gateway::run(settings, listener, admin, async move {
            let _ = stopped.await;
        }));
        RunningGateway {
            url: format!("ws://{addr}/ws"),
            admin: format!("http://{admin_addr}"),
            stop: Some(stop),
            task,
        }
    }

    /// Connects `user` to the gateway at `url`.
    pub async fn connect(&self, url: &str, user: i64) -> WsClient {
        WsClient::connect(url, &self.app.token(user)).await
    }
}

impl Pipeline {
    /// The fanout lists on this namespace's deliveries topic, read from the start, until
    /// `done` says so (fails at the deadline with what it read). What fanout decided,
    /// before any gateway or client.
    pub async fn deliveries_until(
        &self,
        deadline: Duration,
        mut done: impl FnMut(&[chatpipe_schemas::delivery::Delivery]) -> bool,
    ) -> Vec<chatpipe_schemas::delivery::Delivery> {
        use chatpipe_core::kafka::StreamConsumer;
        use rdkafka::consumer::Consumer;
        use rdkafka::Message as _;
        let topic = self.deliveries_topic();
        let consumer: StreamConsumer = chatpipe_core::kafka::consumer_config(
            &brokers(),
            &format!("{topic}-read-{}", uuid::Uuid::new_v4()),
        )
        .create_guarded()
        .expect("Kafka consumer");
        consumer.subscribe(&[&topic]).expect("subscribe");
        let registry = chatpipe_schemas::registry::Registry::new(&registry_url(), deadline)
            .expect("registry client");
        let until = tokio::time::Instant::now() + deadline;
        let mut lists = Vec::new();
        while !done(&lists) {
            let m = tokio::time::timeout_at(until, consumer.recv())
                .await
                .unwrap_or_else(|_| {
                    panic!(
                        "{} fanout lists on {topic} after {deadline:?}: {lists:?}",
                        lists.len()
                    )
                })
                .expect("consuming the deliveries topic");
            let bytes = m.payload().expect("fanout lists have values");
            let (id, _) = chatpipe_schemas::avro::split_frame(bytes).expect("framed Avro");
            let writer = registry.writer_schema(id).await.expect("the writer schema");
            // A fanout member's presence.applied is for the gateway, not a list.
            use chatpipe_schemas::delivery::Listed;
            if let Listed::List(list) = Listed::decode_with(&writer, bytes).expect("a fanout list")
            {
                lists.push(list);
            }
        }
        crate::stream::close_consumer(consumer, "deliveries").await;
        lists
    }
}

/// Connects as a client would after a disconnect: retry with backoff until the gateway
/// answers.
pub async fn reconnect(url: &str, token: &str) -> WsClient {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut backoff = Duration::from_millis(50);
    loop {
        match WsClient::try_connect(url, token).await {
            Ok(ws) => return ws,
            Err(err) => {
                assert!(
                    Instant::now() < deadline,
                    "the gateway never came back: {err}"
                );
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_millis(500));
            }
        }
    }
}

/// Waits until `topic` holds a tombstone (a record without a value) under `key`.
pub async fn wait_for_tombstone(topic: &str, key: &str, deadline: Duration) {
    use chatpipe_core::kafka::StreamConsumer;
    use rdkafka::consumer::Consumer;
    use rdkafka::Message;
    let consumer: StreamConsumer = chatpipe_core::kafka::consumer_config(
        &brokers(),
        &format!("{topic}-tombstones-{}", uuid::Uuid::new_v4()),
    )
    .create_guarded()
    .expect("Kafka consumer");
    consumer.subscribe(&[topic]).expect("subscribe");
    let until = tokio::time::Instant::now() + deadline;
    loop {
        let m = tokio::time::timeout_at(until, consumer.recv())
            .await
            .unwrap_or_else(|_| panic!("no tombstone for {key} on {topic} within {deadline:?}"))
            .expect("consuming");
        if m.key() == Some(key.as_bytes()) && m.payload().is_none() {
            drop(m);
            crate::stream::close_consumer(consumer, "tombstone check").await;
            return;
        }
    }
}

/// A fanout processor on a thread of this test.
pub struct FanoutProcessor {
    stop: chatpipe_runtime::CancellationToken,
    pub status: Arc<pipeline::fanout::Status>,
    /// Its readers' state, as its `/readyz` would report it.
    pub readiness: chatpipe_runtime::Readiness,
    thread: Option<std::thread::JoinHandle<anyhow::Result<()>>>,
}

/// How a processor with a presence table runs: `fanout::run_with`, `notify::run_with`.
type RunWith = fn(
    &pipeline::settings::Settings,
    chatpipe_runtime::CancellationToken,
    Arc<pipeline::fanout::Status>,
    &chatpipe_runtime::Readiness,
) -> anyhow::Result<()>;

impl FanoutProcessor {
    /// Runs `run` with `settings` on a thread of its own until the handle is dropped.
    fn start(settings: pipeline::settings::Settings, run: RunWith) -> Self {
        chatpipe_core::telemetry::init_logging();
        let stop = chatpipe_runtime::CancellationToken::new();
        let status = Arc::new(pipeline::fanout::Status::default());
        let readiness = chatpipe_runtime::Readiness::default();
        let (flag, st, r) = (stop.clone(), status.clone(), readiness.clone());
        let thread = std::thread::spawn(move || run(&settings, flag, st, &r));
        Self {
            stop,
            status,
            readiness,
            thread: Some(thread),
        }
    }

    /// Waits until the processor's presence table shows every one of `users` online
    /// (their gateway published it, and the processor read it).
    pub async fn wait_online(&self, users: &[i64], deadline: Duration) {
        let until = Instant::now() + deadline;
        loop {
            let seen = self.status.online_among(&typed(users));
            if seen == users.len() {
                return;
            }
            assert!(
                Instant::now() < until,
                "fanout sees {seen} of {} users online after {deadline:?}",
                users.len()
            );
            assert!(self.is_running(), "the fanout processor stopped");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Waits until none of `users` counts as online any more.
    pub async fn wait_offline(&self, users: &[i64], deadline: Duration) {
        let until = Instant::now() + deadline;
        while self.status.online_among(&typed(users)) > 0 {
            assert!(
                Instant::now() < until,
                "users still online after {deadline:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub fn is_running(&self) -> bool {
        self.thread.as_ref().is_some_and(|t| !t.is_finished())
    }

    /// Stops it as SIGTERM would (commit, leave the group), and waits until it has.
    pub fn stop(mut self) -> anyhow::Result<()> {
        self.stop.cancel();
        self.thread
            .take()
            .expect("running")
            .join()
            .expect("the fanout thread panicked")
    }
}

impl Drop for FanoutProcessor {
    fn drop(&mut self) {
        self.stop.cancel();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A gateway on a task of this test.
pub struct RunningGateway {
    pub url: String,
    /// `http://host:port` of its admin listener: `/metrics`, `/readyz` with each reader.
    pub admin: String,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
}

impl RunningGateway {
    /// Stops it as SIGTERM would, and waits until it has (an error after 30 s: its own
    /// shutdown is bounded well below that).
    pub async fn stop(mut self) -> anyhow::Result<()> {
        let _ = self.stop.take().expect("running").send(());
        tokio::time::timeout(Duration::from_secs(30), &mut self.task)
            .await
            .map_err(|_| anyhow::anyhow!("the gateway did not stop within 30 s"))??
    }
}

impl Drop for RunningGateway {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// A WebSocket client of the gateway.
pub struct WsClient {
    ws: WebSocketStream<MaybeTlsStream<TcpStream>>,
}

/// What a client saw last.
#[derive(Debug)]
pub enum Seen {
    Frame(Value),
    Closed(Option<CloseFrame>),
}

impl WsClient {
    pub async fn connect(url: &str, token: &str) -> Self {
        Self::try_connect(url, token)
            .await
            .unwrap_or_else(|e| panic!("connecting to {url}: {e}"))
    }

    /// A client whose socket receive buffer is `bytes`: one that stops reading stalls
    /// the server's writes almost at once.
    pub async fn connect_with_recv_buffer(url: &str, token: &str, bytes: u32) -> Self {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.set_recv_buffer_size(bytes).unwrap();
        let ws = gateway::client::connect_over(url, token, socket)
            .await
            .unwrap_or_else(|e| panic!("connecting to {url}: {e}"));
        Self { ws }
    }

    /// Connects, or fails after 30 s: a gateway that accepted the socket but never
    /// answers the upgrade (stuck before it serves) fails the test here, with its URL.
    pub async fn try_connect(url: &str, token: &str) -> anyhow::Result<Self> {
        let ws = tokio::time::timeout(
            Duration::from_secs(30),
            gateway::client::connect(url, token),
        )
        .await
        .map_err(|_| anyhow::anyhow!("no WebSocket upgrade from {url} within 30 s"))??;
        Ok(Self { ws })
    }

    /// The next JSON frame or close, answering pings; None at the deadline.
    pub async fn next(&mut self, deadline: Duration) -> Option<Seen> {
        let until = tokio::time::Instant::now() + deadline;
        loop {
            let frame = tokio::time::timeout_at(until, self.ws.next()).await.ok()?;
            match frame {
                Some(Ok(Message::Text(t))) => {
                    return Some(Seen::Frame(
                        serde_json::from_str(&t).expect("frames are JSON"),
                    ))
                }
                Some(Ok(Message::Close(reason))) => return Some(Seen::Closed(reason)),
                Some(Ok(Message::Ping(p))) => {
                    let _ = self.ws.send(Message::Pong(p)).await;
                }
                Some(Ok(_)) => {}
                Some(Err(_)) | None => return Some(Seen::Closed(None)),
            }
        }
    }

    /// Reads past frames until the connection closes; its close frame (`None`: closed
    /// without one). Fails the test at the deadline.
    pub async fn until_closed(&mut self, deadline: Duration) -> Option<CloseFrame> {
        let until = Instant::now() + deadline;
        loop {
            let left = until.saturating_duration_since(Instant::now());
            match self.next(left).await {
                Some(Seen::Closed(close)) => return close,
                Some(Seen::Frame(_)) => continue,
                None => panic!("the connection is still open after {deadline:?}"),
            }
        }
    }

    /// The next frame, failing the test at the deadline or on a close.
    pub async fn frame(&mut self, deadline: Duration) -> Value {
        match self.next(deadline).await {
            Some(Seen::Frame(v)) => v,
            Some(Seen::Closed(reason)) => panic!("closed instead of a frame: {reason:?}"),
            None => panic!("no frame within {deadline:?}"),
        }
    }

    /// Frames until one matches `want` (returned with those before it).
    pub async fn until(
        &mut self,
        deadline: Duration,
        want: impl Fn(&Value) -> bool,
    ) -> (Value, Vec<Value>) {
        let until = Instant::now() + deadline;
        let mut before = Vec::new();
        loop {
            let left = until.saturating_duration_since(Instant::now());
            let frame = match self.next(left).await {
                Some(Seen::Frame(v)) => v,
                other => panic!("waiting for a frame: {other:?}; saw {before:?}"),
            };
            if want(&frame) {
                return (frame, before);
            }
            before.push(frame);
        }
    }

    pub async fn close(mut self) {
        let _ = self.ws.close(None).await;
    }

    /// Sends a text frame, as a client acks (`{"type": "ack", …}`).
    pub async fn send_text(&mut self, text: &str) {
        self.ws
            .send(Message::Text(text.to_owned().into()))
            .await
            .expect("sending a frame");
    }

    /// Sends a text frame; `false` once the socket takes no more (closed).
    pub async fn try_send_text(&mut self, text: &str) -> bool {
        self.ws
            .send(Message::Text(text.to_owned().into()))
            .await
            .is_ok()
    }

    /// Keeps reading in the background (answering pings, as a real client does while
    /// its user looks elsewhere) and collects every frame.
    pub fn collect(mut self) -> Collector {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let task = tokio::spawn(async move {
            loop {
                match self.next(Duration::from_secs(3600)).await {
                    Some(Seen::Frame(v)) => {
                        if tx.send(v).is_err() {
                            return;
                        }
                    }
                    other => {
                        let _ = tx.send(serde_json::json!({"closed": format!("{other:?}")}));
                        return;
                    }
                }
            }
        });
        Collector {
            rx,
            task,
            seen: Vec::new(),
        }
    }
}

/// Every frame a [`WsClient`] received, read in the background.
pub struct Collector {
    rx: tokio::sync::mpsc::UnboundedReceiver<Value>,
    task: tokio::task::JoinHandle<()>,
    /// Every frame so far, in order.
    pub seen: Vec<Value>,
}

impl Collector {
    /// Waits until a frame received so far matches `want`; fails the test at the deadline.
    pub async fn until(&mut self, deadline: Duration, want: impl Fn(&Value) -> bool) -> Value {
        match self.try_until(deadline, want).await {
            Some(frame) => frame,
            None => panic!("no matching frame within {deadline:?}; saw {:?}", self.seen),
        }
    }

    /// Like [`Collector::until`], but `None` at the deadline instead of failing.
    pub async fn try_until(
        &mut self,
        deadline: Duration,
        want: impl Fn(&Value) -> bool,
    ) -> Option<Value> {
        let until = tokio::time::Instant::now() + deadline;
        loop {
            if let Some(f) = self.seen.iter().find(|f| want(f)) {
                return Some(f.clone());
            }
            match tokio::time::timeout_at(until, self.rx.recv()).await {
                Ok(Some(frame)) => {
                    assert!(
                        frame.get("closed").is_none(),
                        "the connection closed: {frame}"
                    );
                    self.seen.push(frame);
                }
                Ok(None) => panic!("the collector stopped; saw {:?}", self.seen),
                Err(_) => return None,
            }
        }
    }

    /// Takes in what has arrived so far, without waiting.
    pub fn drain(&mut self) -> &[Value] {
        while let Ok(frame) = self.rx.try_recv() {
            self.seen.push(frame);
        }
        &self.seen
    }
}

impl Drop for Collector {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn typed(users: &[i64]) -> Vec<UserId> {
    users.iter().map(|&u| UserId::of(u)).collect()
}
