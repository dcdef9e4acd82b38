//! The stream read path: a read receipt goes to `chat.read-receipts` (Avro, keyed by
//! conversation id) and the receipts processor applies it in a batched, monotone UPDATE.

use std::time::Duration;

use chatpipe_core::kafka::{CreateGuarded, FutureProducer};
use chatpipe_schemas::receipt::{Mark, ReadReceipt, ReceiptCodec};
use rdkafka::producer::FutureRecord;

use crate::configuration::KafkaSettings;

#[derive(Clone)]
pub struct ReceiptProducer {
    producer: FutureProducer,
    codec: ReceiptCodec,
    topic: String,
    acks_codec: ReceiptCodec,
    acks_topic: String,
    timeout: Duration,
}

#[derive(Debug, thiserror::Error)]
#[error("producing the read receipt to {topic}: {cause}")]
pub struct ProduceError {
    topic: String,
    cause: String,
}

impl ReceiptProducer {
    pub fn new(
        kafka: &KafkaSettings,
        codec: ReceiptCodec,
        acks_codec: ReceiptCodec,
    ) -> anyhow::Result<Self> {
        let producer = chatpipe_core::kafka::apply(
            chatpipe_core::kafka::producer_config(&kafka.brokers),
            &kafka.properties,
        )
        .set(
            "queue.buffering.max.messages",
            kafka.queue_max_messages.to_string(),
        )
        .set("message.timeout.ms", kafka.produce_timeout_ms.to_string())
        .set("linger.ms", kafka.linger_ms.to_string())
        .create_guarded()?;
        Ok(Self {
            producer,
            codec,
            topic: kafka.receipts_topic.clone(),
            acks_codec,
            acks_topic: kafka.acks_topic.clone(),
            timeout: Duration::from_millis(kafka.produce_timeout_ms),
        })
    }

    /// Returns once the broker has the receipt (acks=all), or fails.
    pub async fn send(&self, mark: Mark, receipt: &ReadReceipt) -> Result<(), ProduceError> {
        let (codec, topic) = match mark {
            Mark::Read => (&self.codec, &self.topic),
            Mark::Delivered => (&self.acks_codec, &self.acks_topic),
        };
        let key = receipt.conversation_id.to_string();
        let payload = codec.encode(receipt);
        let record = FutureRecord::to(topic).key(&key).payload(&payload);
        match self.producer.send(record, self.timeout).await {
            Ok(_) => {
                metrics::counter!("receipts_produced_total").increment(1);
                Ok(())
            }
            Err((err, _)) => {
                if matches!(
                    err,
                    rdkafka::error::KafkaError::MessageProduction(
                        rdkafka::types::RDKafkaErrorCode::QueueFull
                    )
                ) {
                    metrics::counter!("receipts_queue_full_total").increment(1);
                }
                metrics::counter!("receipts_produce_failures_total").increment(1);
                Err(ProduceError {
                    topic: topic.clone(),
                    cause: err.to_string(),
                })
            }
        }
    }
}
