//! What a client says over the socket. Clients send messages and reads over REST; here
//! they say two things, both signals nobody stores as they are:
//!
//! - `{"type": "ack", "conversationId": …, "seq": …}`: "this device got every message of
//!   the conversation up to seq" (delivered ticks). Produced onto `chat.delivery-acks` as
//!   a receipt record; the receipts processor applies it (membership checked there: a
//!   non-member's ack is dropped and counted; a seq above the last one is clamped). Acks
//!   are cumulative, so one lost to a broker outage is made good by the next: they are
//!   sent without waiting for the broker.
//!   A connection passes on a conversation's acks at most once per `ack_interval_ms`:
//!   the first at once, the highest seq of those that come within the interval at its
//!   end.
//! - `{"type": "typing", "conversationId": …}`: produced onto `chat.ephemeral` (never
//!   PostgreSQL, never `chat.events`), at most once per `typing_interval_ms` per
//!   conversation and connection (the last 64 conversations remembered, least recently
//!   used forgotten first); fanout checks membership and throttles per user.
//!
//! Every text frame takes a token of its connection's bucket (`signals.frames`); a client
//! past it is closed with 1008 "too many frames", so one socket cannot fill the signals'
//! producer queue that every connection of the gateway shares.

use std::num::NonZeroU32;
use std::time::Duration;

use governor::{DefaultDirectRateLimiter, Quota};
use lru::LruCache;
use tokio::time::Instant;

use chatpipe_core::kafka::FutureProducer;
use chatpipe_core::{ConversationId, Seq, UserId};
use chatpipe_schemas::ephemeral::{Ephemeral, EphemeralCodec, TYPING};
use chatpipe_schemas::receipt::{ReadReceipt, ReceiptCodec};
use rdkafka::producer::FutureRecord;
use serde::Deserialize;

#[derive(Clone)]
pub struct Signals {
    pub producer: FutureProducer,
    pub acks_codec: ReceiptCodec,
    pub acks_topic: String,
    pub ephemeral_codec: EphemeralCodec,
    pub ephemeral_topic: String,
    /// At most one typing signal per conversation per this long leaves a connection.
    pub typing_interval: Duration,
    /// Text frames per connection.
    pub frames: FrameBucket,
    /// At most one ack per conversation per this long leaves a connection.
    pub ack_interval: Duration,
}

/// `signals.frames`: `rate` text frames per `per_secs` seconds, `burst` at once.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FrameBucket {
    pub rate: u32,
    pub per_secs: u32,
    pub burst: u32,
}

impl FrameBucket {
    fn limiter(self) -> DefaultDirectRateLimiter {
        let rate = NonZeroU32::new(self.rate.max(1)).expect("at least 1");
        let period = Duration::from_secs(u64::from(self.per_secs.max(1))) / rate.get();
        let burst = NonZeroU32::new(self.burst).unwrap_or(rate);
        let quota = Quota::with_period(period)
            .expect("a period of at least a nanosecond")
            .allow_burst(burst);
        governor::RateLimiter::direct(quota)
    }
}

/// A client frame, by its `type`.
#[derive(Debug, PartialEq, Eq)]
pub enum ClientFrame {
    Ack {
        conversation: ConversationId,
        seq: Seq,
    },
    Typing {
        conversation: ConversationId,
    },
    /// A type this gateway does not know (a newer client's): ignored.
    Unknown,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct TypingFields {
    #[allow(dead_code)]
    r#type: String,
    conversation_id: i64,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct AckFields {
    #[allow(dead_code)]
    r#type: String,
    conversation_id: i64,
    seq: i64,
}

/// Reads a client's text frame; `Err` says what is wrong with it.
pub fn parse(text: &str) -> Result<ClientFrame, String> {
    let value: serde_json::Value =
        serde_json::from_str(text).map_err(|e| format!("not JSON: {e}"))?;
    match value.get("type").and_then(|t| t.as_str()) {
        Some("ack") => {
            let f: AckFields = serde_json::from_value(value).map_err(|e| format!("ack: {e}"))?;
            Ok(ClientFrame::Ack {
                conversation: ConversationId::new(f.conversation_id)
                    .map_err(|e| format!("ack: conversationId: {e}"))?,
                seq: Seq::new(f.seq).map_err(|e| format!("ack: seq: {e}"))?,
            })
        }
        Some("typing") => {
            let f: TypingFields =
                serde_json::from_value(value).map_err(|e| format!("typing: {e}"))?;
            Ok(ClientFrame::Typing {
                conversation: ConversationId::new(f.conversation_id)
                    .map_err(|e| format!("typing: conversationId: {e}"))?,
            })
        }
        Some(_) => Ok(ClientFrame::Unknown),
        None => Err("no \"type\"".into()),
    }
}

/// One connection's side: who it is, its frame bucket, and when it last passed on an
/// ack and typing per conversation.
pub struct ConnectionSignals {
    signals: Signals,
    user: UserId,
    frames: DefaultDirectRateLimiter,
    typed: Remembered<Instant>,
    acked: Remembered<Acked>,
}

/// A conversation's acks on one connection: when one last left, and the highest seq
/// held back since.
#[derive(Debug, Clone, Copy)]
struct Acked {
    sent_at: Instant,
    held: Option<Seq>,
}

/// Conversations a connection remembers typing and acks in (least recently used
/// forgotten first; a forgotten held-back ack leaves at once).
const REMEMBERED: usize = 64;

/// Up to [`REMEMBERED`] conversations, made at the first one: an `LruCache` allocates its
/// whole table when it is made (2.2 KiB at 64), which was a third of what an idle
/// connection cost; a connection that never acks or types never pays it.
struct Remembered<V>(Option<LruCache<ConversationId, V>>);

impl<V> Remembered<V> {
    fn new() -> Self {
        Self(None)
    }

    fn cache(&mut self) -> &mut LruCache<ConversationId, V> {
        self.0.get_or_insert_with(|| {
            LruCache::new(std::num::NonZeroUsize::new(REMEMBERED).expect("more than 0"))
        })
    }

    fn iter(&self) -> impl Iterator<Item = (&ConversationId, &V)> {
        self.0.iter().flat_map(|cache| cache.iter())
    }
}

impl Signals {
    /// The signals of one of `user`'s connections.
    pub fn connection(&self, user: UserId) -> ConnectionSignals {
        ConnectionSignals {
            signals: self.clone(),
            user,
            frames: self.frames.limiter(),
            typed: Remembered::new(),
            acked: Remembered::new(),
        }
    }
}

impl crate::connection::ClientFrames for ConnectionSignals {
    fn text(&mut self, text: &str) -> bool {
        if self.frames.check().is_err() {
            return false;
        }
        self.handle(text);
        true
    }

    fn next_flush(&self) -> Option<Instant> {
        self.acked
            .iter()
            .filter(|(_, a)| a.held.is_some())
            .map(|(_, a)| a.sent_at + self.signals.ack_interval)
            .min()
    }

    fn flush(&mut self) {
        let now = Instant::now();
        let due: Vec<(ConversationId, Seq)> = self
            .acked
            .iter()
            .filter(|(_, a)| now >= a.sent_at + self.signals.ack_interval)
            .filter_map(|(c, a)| a.held.map(|seq| (*c, seq)))
            .collect();
        for (conversation, seq) in due {
            self.send_ack(conversation, seq, now);
        }
    }

    fn end(&mut self) {
        let held: Vec<(ConversationId, Seq)> = self
            .acked
            .iter()
            .filter_map(|(c, a)| a.held.map(|seq| (*c, seq)))
            .collect();
        for (conversation, seq) in held {
            self.produce_ack(conversation, seq);
        }
    }
}

impl ConnectionSignals {
    /// Acts on one text frame of the connection.
    pub fn handle(&mut self, text: &str) {
        let user = self.user;
        match parse(text) {
            Ok(ClientFrame::Ack { conversation, seq }) => self.ack(conversation, seq),
            Ok(ClientFrame::Typing { conversation }) => self.typing(conversation),
            Ok(ClientFrame::Unknown) => {
                metrics::counter!("gateway_client_frames_total", "kind" => "unknown").increment(1);
            }
            Err(why) => {
                metrics::counter!("gateway_client_frames_total", "kind" => "invalid").increment(1);
                tracing::debug!(%user, why, "a client frame that is not one: ignored");
            }
        }
    }

    /// Passes the ack on at once if none of the conversation left within the interval;
    /// holds it back (the highest seq) otherwise.
    fn ack(&mut self, conversation: ConversationId, seq: Seq) {
        metrics::counter!("gateway_client_frames_total", "kind" => "ack").increment(1);
        let now = Instant::now();
        if let Some(acked) = self.acked.cache().get_mut(&conversation) {
            if now < acked.sent_at + self.signals.ack_interval {
                acked.held = Some(acked.held.map_or(seq, |held| held.max(seq)));
                metrics::counter!("gateway_acks_total", "result" => "coalesced").increment(1);
                return;
            }
        }
        self.send_ack(conversation, seq, now);
    }

    fn send_ack(&mut self, conversation: ConversationId, seq: Seq, now: Instant) {
        let forgotten = self.acked.cache().push(
            conversation,
            Acked {
                sent_at: now,
                held: None,
            },
        );
        // A conversation pushed out of the memory takes its held-back ack with it.
        if let Some((
            other,
            Acked {
                held: Some(held), ..
            },
        )) = forgotten
        {
            if other != conversation {
                self.produce_ack(other, held);
            }
        }
        self.produce_ack(conversation, seq);
    }

    fn produce_ack(&self, conversation: ConversationId, seq: Seq) {
        let receipt = ReadReceipt {
            conversation_id: conversation,
            user_id: self.user,
            seq,
            at: chatpipe_core::outbox::now(),
        };
        let payload = self.signals.acks_codec.encode(&receipt);
        self.produce(
            &self.signals.acks_topic,
            conversation,
            payload,
            "gateway_acks_total",
        );
    }

    fn typing(&mut self, conversation: ConversationId) {
        metrics::counter!("gateway_client_frames_total", "kind" => "typing").increment(1);
        let now = Instant::now();
        if self
            .typed
            .cache()
            .get(&conversation)
            .is_some_and(|at| now.duration_since(*at) < self.signals.typing_interval)
        {
            metrics::counter!("gateway_typing_total", "result" => "throttled").increment(1);
            return;
        }
        self.typed.cache().put(conversation, now);
        let signal = Ephemeral {
            kind: TYPING.into(),
            conversation_id: conversation,
            user_id: self.user,
            at: chatpipe_core::outbox::now(),
        };
        let payload = self.signals.ephemeral_codec.encode(&signal);
        self.produce(
            &self.signals.ephemeral_topic,
            conversation,
            payload,
            "gateway_typing_total",
        );
    }

    /// Hands a record to the producer without waiting; counts what became of it.
    fn produce(
        &self,
        topic: &str,
        conversation: ConversationId,
        payload: Vec<u8>,
        metric: &'static str,
    ) {
        let key = conversation.to_string();
        let record = FutureRecord::to(topic).key(&key).payload(&payload);
        match self.signals.producer.send_result(record) {
            Ok(delivery) => {
                tokio::spawn(async move {
                    let result = match delivery.await {
                        Ok(Ok(_)) => "produced",
                        _ => "failed",
                    };
                    metrics::counter!(metric, "result" => result).increment(1);
                });
            }
            // The producer's queue is full (the broker is away): a signal is worth
            // nothing late, and the next ack covers a lost one.
            Err(_) => metrics::counter!(metric, "result" => "dropped").increment(1),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn acks_and_typing_parse_and_anything_else_is_unknown_or_invalid() {
        assert_eq!(
            parse(r#"{"type":"ack","conversationId":7,"seq":12}"#),
            Ok(ClientFrame::Ack {
                conversation: ConversationId::of(7),
                seq: Seq::of(12)
            })
        );
        assert_eq!(
            parse(r#"{"type":"typing","conversationId":7}"#),
            Ok(ClientFrame::Typing {
                conversation: ConversationId::of(7)
            })
        );
        assert_eq!(
            parse(r#"{"type":"wave","conversationId":7}"#),
            Ok(ClientFrame::Unknown)
        );
        // A newer client's field is ignored; the frame is applied.
        assert_eq!(
            parse(r#"{"type":"ack","conversationId":7,"seq":12,"device":"phone"}"#),
            Ok(ClientFrame::Ack {
                conversation: ConversationId::of(7),
                seq: Seq::of(12)
            })
        );
        for bad in [
            "ack",
            "{}",
            r#"{"type":"ack","conversationId":7}"#,
            r#"{"type":"ack","conversationId":0,"seq":1}"#,
            r#"{"type":"ack","conversationId":7,"seq":0}"#,
            r#"{"type":"ack","conversationId":"7","seq":1}"#,
            r#"{"type":"typing"}"#,
            r#"{"type":"typing","conversationId":-1}"#,
        ] {
            assert!(parse(bad).is_err(), "{bad}");
        }
    }
}
