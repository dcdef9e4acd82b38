//! This gateway's partition of chat.deliveries: each fanout list becomes one frame,
//! queued for the sessions of the users on the list (and nobody else). The partition is
//! read from its end: after a restart, clients catch up over REST, not from old lists.

use std::collections::HashMap;

use chatpipe_schemas::avro::split_frame;
use chatpipe_schemas::delivery::{Delivery, MESSAGE_NEW};
use chatpipe_schemas::registry::EventDecoder;
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::message::BorrowedMessage;
use rdkafka::producer::FutureProducer;
use rdkafka::{Message, Offset, TopicPartitionList};
use serde_json::json;

use crate::sessions::Sessions;

pub struct Reader {
    pub consumer: StreamConsumer,
    pub decoder: EventDecoder,
    pub topic: String,
    pub partition: i32,
    pub dlq: FutureProducer,
    /// Writer schemas by id (the registry is asked once per version).
    pub schemas: HashMap<u32, apache_avro::Schema>,
}

/// The frame a client receives for a fanout list (docs/protocol.md).
pub fn frame(d: &Delivery) -> serde_json::Value {
    let occurred_at = chrono::DateTime::from_timestamp_micros(d.occurred_at)
        .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Micros, true));
    if d.event_type == MESSAGE_NEW {
        if d.light {
            json!({"type": "message.new", "conversationId": d.conversation_id, "seq": d.seq, "light": true})
        } else {
            json!({
                "type": "message.new",
                "conversationId": d.conversation_id,
                "seq": d.seq,
                "senderId": d.sender_id,
                "body": d.body,
                "createdAt": occurred_at,
            })
        }
    } else if d.light {
        json!({"type": "read.updated", "conversationId": d.conversation_id, "lastReadSeq": d.last_read_seq, "light": true})
    } else {
        json!({
            "type": "read.updated",
            "conversationId": d.conversation_id,
            "userId": d.user_id,
            "lastReadSeq": d.last_read_seq,
        })
    }
}

impl Reader {
    pub fn assign(&self) -> anyhow::Result<()> {
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(&self.topic, self.partition, Offset::End)?;
        self.consumer.assign(&tpl)?;
        Ok(())
    }

    /// Pushes every list that arrives until `shutdown`.
    pub async fn run(
        mut self,
        sessions: Sessions,
        shutdown: impl std::future::Future<Output = ()>,
    ) {
        tokio::pin!(shutdown);
        let dlq_topic = format!("{}.dlq", self.topic);
        loop {
            let message = tokio::select! {
                m = self.consumer.recv() => m,
                () = &mut shutdown => return,
            };
            let message = match message {
                Ok(m) => m,
                Err(err) => {
                    metrics::counter!("gateway_deliveries_errors_total").increment(1);
                    tracing::warn!("deliveries consumer: {err}");
                    continue;
                }
            };
            match decode(&mut self.schemas, &self.decoder, &message).await {
                Ok(d) => {
                    let text = frame(&d).to_string();
                    metrics::counter!("gateway_deliveries_total").increment(1);
                    sessions.push_committed(&d.user_ids, &text, Some(d.occurred_at));
                    // Let the connections write before the next list: a burst read from
                    // Kafka in one go must not fill queues that are draining fine.
                    tokio::task::yield_now().await;
                }
                Err(error) => {
                    tracing::warn!(
                        offset = message.offset(),
                        error,
                        "undecodable fanout list: to {dlq_topic}"
                    );
                    metrics::counter!("gateway_deliveries_dlq_total").increment(1);
                    if let Err(err) =
                        chatpipe_core::kafka::dead_letter(&self.dlq, &dlq_topic, &message, &error)
                            .await
                    {
                        tracing::error!("dead-lettering: {err:#}");
                    }
                }
            }
        }
    }
}

async fn decode(
    schemas: &mut HashMap<u32, apache_avro::Schema>,
    decoder: &EventDecoder,
    m: &BorrowedMessage<'_>,
) -> Result<Delivery, String> {
    let bytes = m.payload().ok_or("record without a value")?;
    let (id, _) = split_frame(bytes).map_err(|e| e.to_string())?;
    if let std::collections::hash_map::Entry::Vacant(slot) = schemas.entry(id) {
        slot.insert(decoder.writer_schema(id).await.map_err(|e| e.to_string())?);
    }
    Delivery::decode_with(&schemas[&id], bytes).map_err(|e| e.to_string())
}
