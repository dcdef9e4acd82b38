//! The notifications processor (`pipeline notifications`): tells members who are offline
//! about new messages, for whoever sends to APNs, FCM or Web Push (docs/topics.md,
//! "chat.notifications").
//!
//! It reads `chat.events` in a group of its own. Each conversation's new messages wait
//! in a window of `notifications.collapse_ms` from the first ([`window`]); then one
//! statement joins them with the conversation's members, each member's level and mute,
//! the mentions and the threads' roots, as PostgreSQL holds them at that moment, and
//! gives per member what they should hear about: at level `all` every message, at
//! `mentions` those that name them and replies in threads they started, at `none` (or
//! muted) nothing; never their own messages, a message deleted by then, or one they have
//! read. Members the presence table ([`crate::fanout::presence`], read from
//! `chat.presence` as fanout reads it) shows connected get nothing: their sockets had it.
//! Each other member gets one record on `chat.notifications`, keyed by user id, for all
//! of the window's messages they should hear about.
//!
//! Offsets are committed only below the first message of every window still open, and a
//! window closes once its records are acknowledged: a crash or a rebalance sends a
//! window's records again (at least once; consumers dedupe by (userId, conversationId,
//! lastSeq)), never loses one. An outage of PostgreSQL or Kafka holds the window and the
//! reader's position, and is retried.

pub mod window;

use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use chatpipe_core::kafka::{CreateGuarded, FutureProducer};
use chatpipe_runtime::{
    CancellationToken, Failure, Position, Processor, ReaderHealth, ReaderSpec, Readiness,
    Supervisor,
};
use chatpipe_schemas::notification::{Notification, NotificationCodec, MENTION, MESSAGE, REPLY};
use chatpipe_schemas::{ChatEvent, ConversationId, Seq, UserId};
use chrono::{DateTime, Utc};
use rdkafka::producer::FutureRecord;
use sqlx::PgPool;
use tokio::runtime::Handle;

use crate::fanout::Status as Presence;
use crate::settings::{NotificationSettings, Settings};
use window::Windows;

/// Per member of conversation `$1`, what of its messages `$2` they should hear about:
/// how many, the first and newest, the newest's sender, preview (`$3` characters; none
/// at 0), thread and time, and whether one names them or replies in their thread (the
/// root's author as `message_thread` keeps it, also once the root is archived).
/// Messages older than `$4` seconds are not told.
const RECIPIENTS_SQL: &str = "SELECT m.user_id, count(*) AS count,
        min(g.seq) AS first_seq, max(g.seq) AS last_seq,
        (array_agg(g.sender_id ORDER BY g.seq DESC))[1] AS sender_id,
        (array_agg(CASE WHEN $3 > 0 THEN left(g.body, $3) END ORDER BY g.seq DESC))[1] AS preview,
        (array_agg(g.thread_root_seq ORDER BY g.seq DESC))[1] AS thread_root_seq,
        max(g.created_at) AS created_at,
        bool_or(n.user_id IS NOT NULL) AS mentioned,
        coalesce(bool_or(t.root_sender_id = m.user_id), false) AS replied_to
   FROM message g
   JOIN conversation_member m ON m.conversation_id = g.conversation_id
   LEFT JOIN message_mention n
     ON n.conversation_id = g.conversation_id AND n.seq = g.seq AND n.user_id = m.user_id
   LEFT JOIN message_thread t
     ON t.conversation_id = g.conversation_id AND t.root_seq = g.thread_root_seq
  WHERE g.conversation_id = $1 AND g.seq = ANY($2) AND g.deleted_at IS NULL
    AND g.created_at > now() - make_interval(secs => $4)
    AND m.user_id <> g.sender_id AND g.seq > m.last_read_seq
    AND (m.muted_until IS NULL OR m.muted_until <= now())
    AND (m.notify_level = 'all'
         OR (m.notify_level = 'mentions' AND (n.user_id IS NOT NULL OR t.root_sender_id = m.user_id)))
  GROUP BY m.user_id
  ORDER BY m.user_id";

#[derive(sqlx::FromRow)]
struct Recipient {
    user_id: i64,
    count: i64,
    first_seq: i64,
    last_seq: i64,
    sender_id: i64,
    preview: Option<String>,
    thread_root_seq: Option<i64>,
    created_at: DateTime<Utc>,
    mentioned: bool,
    replied_to: bool,
}

impl Recipient {
    fn notification(self, conversation: ConversationId) -> anyhow::Result<Notification> {
        let kind = if self.mentioned {
            MENTION
        } else if self.replied_to {
            REPLY
        } else {
            MESSAGE
        };
        Ok(Notification {
            user_id: UserId::new(self.user_id)?,
            conversation_id: conversation,
            kind: kind.into(),
            count: self.count,
            first_seq: Seq::new(self.first_seq)?,
            last_seq: Seq::new(self.last_seq)?,
            sender_id: UserId::new(self.sender_id)?,
            preview: self.preview,
            thread_root_seq: self.thread_root_seq.map(Seq::new).transpose()?,
            occurred_at: self.created_at.timestamp_micros(),
        })
    }
}

pub struct Notifier {
    handle: Handle,
    pool: PgPool,
    producer: FutureProducer,
    codec: NotificationCodec,
    cfg: NotificationSettings,
    presence: Arc<Presence>,
    windows: Windows,
}

impl Notifier {
    /// Sends the windows that are due; each closes once its records are acknowledged.
    fn flush_due(&mut self) -> Result<(), Failure> {
        let collapse = Duration::from_millis(self.cfg.collapse_ms);
        let due = self
            .windows
            .due(Instant::now(), collapse, self.cfg.max_open_windows);
        for conversation in due {
            let seqs = match self.windows.get(conversation) {
                Some(w) => w.seqs.clone(),
                None => continue,
            };
            let started = Instant::now();
            let written = self
                .handle
                .block_on(self.notify(conversation, &seqs))
                .map_err(|e| {
                    metrics::counter!("notification_flush_failures_total").increment(1);
                    Failure::Retriable(e)
                })?;
            metrics::histogram!("notification_flush_seconds")
                .record(started.elapsed().as_secs_f64());
            metrics::histogram!("notification_window_messages").record(seqs.len() as f64);
            tracing::debug!(%conversation, messages = seqs.len(), written, "window sent");
            self.windows.close(conversation);
        }
        metrics::gauge!("notification_windows_open").set(self.windows.open_count() as f64);
        Ok(())
    }

    /// The records for `conversation`'s messages `seqs`, written and acknowledged; how
    /// many.
    async fn notify(&self, conversation: ConversationId, seqs: &[i64]) -> anyhow::Result<usize> {
        let recipients: Vec<Recipient> = sqlx::query_as(RECIPIENTS_SQL)
            .bind(conversation.get())
            .bind(seqs)
            .bind(self.cfg.preview_chars as i32)
            .bind(self.cfg.max_age_ms as f64 / 1000.0)
            .fetch_all(&self.pool)
            .await
            .context("reading the recipients")?;
        let now_ms = Utc::now().timestamp_millis();
        let mut sends = Vec::new();
        for recipient in recipients {
            let user = UserId::new(recipient.user_id)?;
            if self.presence.is_online(user, now_ms) {
                metrics::counter!("notifications_skipped_total", "reason" => "online").increment(1);
                continue;
            }
            let n = recipient.notification(conversation)?;
            metrics::counter!("notifications_written_total", "kind" => kind_label(&n.kind))
                .increment(1);
            sends.push((user.to_string(), self.codec.encode(&n)));
        }
        let topic = self.cfg.topic.as_str();
        let acks = sends.iter().map(|(key, payload)| {
            let record = FutureRecord::to(topic).key(key).payload(payload);
            self.producer.send(record, Duration::ZERO)
        });
        for ack in futures::future::join_all(acks).await {
            ack.map_err(|(e, _)| anyhow::anyhow!("producing to {topic}: {e}"))?;
        }
        Ok(sends.len())
    }
}

fn kind_label(kind: &str) -> &'static str {
    match kind {
        MENTION => MENTION,
        REPLY => REPLY,
        _ => MESSAGE,
    }
}

impl Processor for Notifier {
    type Record = ChatEvent;

    fn apply(&mut self, at: Position, event: ChatEvent) -> Result<(), Failure> {
        let message = match &event {
            ChatEvent::MessageNew(m) => Some((m.conversation_id, m.seq.get())),
            _ => None,
        };
        self.windows
            .add((at.partition, at.offset), message, Instant::now());
        Ok(())
    }

    fn skip(&mut self, at: Position, _key: Option<&[u8]>) {
        self.windows
            .add((at.partition, at.offset), None, Instant::now());
    }

    fn tick(&mut self) -> Result<(), Failure> {
        self.flush_due()
    }

    fn committable(&mut self) -> Vec<(i32, i64)> {
        self.windows.committable()
    }

    fn revoke(&mut self, partitions: &[i32]) {
        self.windows.forget(partitions);
    }

    fn finish(&mut self) -> Result<(), Failure> {
        // Whatever is open goes out now: a stop is not a reason to wait.
        let max_open = std::mem::replace(&mut self.cfg.max_open_windows, 0);
        let flushed = self.flush_due();
        self.cfg.max_open_windows = max_open;
        flushed
    }
}

/// Runs the notifications processor until `stop` is set, its presence table in
/// `presence`. Blocking: call it from a thread.
pub fn run_with(
    settings: &Settings,
    stop: CancellationToken,
    presence: Arc<Presence>,
    readiness: &Readiness,
) -> anyhow::Result<()> {
    let mut supervisor = Supervisor::new(stop);
    spawn(settings, &mut supervisor, readiness, presence);
    supervisor.wait_blocking()
}

/// Adds the notifications processor's readers (chat.presence into `presence`, and
/// chat.events) to `supervisor`.
pub fn spawn(
    settings: &Settings,
    supervisor: &mut Supervisor,
    readiness: &Readiness,
    presence: Arc<Presence>,
) {
    let caught_up = Arc::new(AtomicBool::new(false));
    let stall_after = settings.readers.stall_after();
    {
        let health = readiness.reader(
            "notifications-presence",
            "notifications_presence",
            stall_after,
        );
        let (settings, presence, caught_up) =
            (settings.clone(), presence.clone(), caught_up.clone());
        supervisor.spawn_thread("notifications-presence", move |stop| {
            crate::fanout::run_presence(
                &settings,
                (&stop, health),
                ("notifications-presence", "notifications_presence"),
                (presence, caught_up),
                false,
            )
        });
    }
    let health = readiness.reader("notifications", "notifications", stall_after);
    let settings = settings.clone();
    supervisor.spawn_thread("notifications", move |stop| {
        run_events(&settings, &stop, health, presence, caught_up)
    });
}

fn run_events(
    settings: &Settings,
    stop: &CancellationToken,
    health: Arc<ReaderHealth>,
    presence: Arc<Presence>,
    caught_up: Arc<AtomicBool>,
) -> anyhow::Result<()> {
    let cfg = settings.notifications.clone();
    let thread = settings.reader_thread(health)?;
    let started = thread.start(stop, "notifications: starting", || async {
        let codec = thread
            .registry()
            .notification_codec_for(&format!("{}-value", cfg.topic))
            .await?;
        let pool = settings.database.connect().await?;
        anyhow::Ok((codec, pool))
    });
    let Some((codec, pool)) = started else {
        return Ok(());
    };
    // Nobody connected is told: only once the presence table has read chat.presence.
    if !crate::fanout::wait_caught_up(&thread, stop, &caught_up) {
        return Ok(());
    }
    let producer: FutureProducer = settings
        .kafka
        .producer()
        .set("linger.ms", "5")
        .create_guarded()
        .context("creating the notifications producer")?;
    let notifier = Notifier {
        handle: thread.handle(),
        pool,
        producer,
        codec,
        cfg: cfg.clone(),
        presence,
        windows: Windows::default(),
    };
    let spec = ReaderSpec::group(
        "notifications",
        "notifications",
        &cfg.events_topic,
        &cfg.group,
        cfg.max_poll_ms,
        &settings.readers,
    );
    tracing::info!(topic = %cfg.topic, group = %cfg.group, "notifications running");
    thread.run(spec, notifier, stop)
}
