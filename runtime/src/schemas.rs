//! Decoding records: writer schemas by the id in each record's frame, asked of the
//! registry once per id and kept, with the registry's answers sorted into outages
//! (retried) and bad records (dead-lettered).

use std::collections::HashMap;
use std::time::Instant;

use apache_avro::Schema;
use chatpipe_schemas::avro::{from_value, read_with, split_frame};
use chatpipe_schemas::delivery::Listed;
use chatpipe_schemas::receipt::ReadReceipt;
use chatpipe_schemas::registry::{LookupError, Registry};
use chatpipe_schemas::ChatEvent;
use rdkafka::Message;
use tokio::runtime::Handle;

use crate::Failure;

/// Writer schemas by id, held by one reader thread.
pub struct WriterSchemas {
    cache: HashMap<u32, Schema>,
    /// Ids the registry answered 404 for, and when that was first seen.
    missing_since: HashMap<u32, Instant>,
    registry: Registry,
    handle: Handle,
}

impl WriterSchemas {
    /// `handle` must belong to a runtime with a worker thread of its own (see
    /// [`crate::reader_runtime`]): lookups block the reader thread on it.
    pub fn new(registry: Registry, handle: Handle) -> Self {
        Self {
            cache: HashMap::new(),
            missing_since: HashMap::new(),
            registry,
            handle,
        }
    }

    /// The runtime lookups block on.
    pub fn handle(&self) -> &Handle {
        &self.handle
    }

    /// The schema the framed `bytes` were written with. Not framed: poison. The registry
    /// not answering: retriable. An id the registry does not have: retriable for
    /// `registry.unknown_id_grace_ms` from when this reader first met it, poison after.
    pub fn of(&mut self, bytes: &[u8]) -> Result<&Schema, Failure> {
        let (id, _) = split_frame(bytes).map_err(|e| Failure::poison(e.to_string()))?;
        match self.cache.entry(id) {
            std::collections::hash_map::Entry::Occupied(e) => Ok(e.into_mut()),
            std::collections::hash_map::Entry::Vacant(e) => {
                match self.handle.block_on(self.registry.writer_schema(id)) {
                    Ok(schema) => {
                        self.missing_since.remove(&id);
                        Ok(e.insert(schema))
                    }
                    Err(LookupError::NotFound(id)) => {
                        let grace = self.registry.unknown_id_grace();
                        let since = *self.missing_since.entry(id).or_insert_with(Instant::now);
                        if since.elapsed() < grace {
                            metrics::counter!("registry_unknown_id_retries_total").increment(1);
                            Err(Failure::retriable(anyhow::anyhow!(
                                "the schema registry has no schema with id {id} (yet): asked \
                                 again for up to {} s before the record is dead-lettered",
                                grace.as_secs()
                            )))
                        } else {
                            Err(LookupError::NotFound(id).into())
                        }
                    }
                    Err(other) => Err(other.into()),
                }
            }
        }
    }

    /// The value of `message`, with its writer schema. A record without a value is poison.
    pub fn framed<'m>(
        &mut self,
        message: &'m impl Message,
    ) -> Result<(&Schema, &'m [u8]), Failure> {
        let bytes = message
            .payload()
            .ok_or_else(|| Failure::poison("record without a value"))?;
        Ok((self.of(bytes)?, bytes))
    }
}

/// A record type a reader decodes its topic's values into.
pub trait Decode: Sized {
    fn decode(message: &impl Message, schemas: &mut WriterSchemas) -> Result<Self, Failure>;
}

/// A record header as text: Kafka Connect's header converter writes strings and numbers
/// (the EventRouter's `id`, `eventType`, `membershipVersion`) as their text. `None`:
/// absent, null or not UTF-8.
pub fn header_text<'m>(message: &'m impl Message, name: &str) -> Option<&'m str> {
    use rdkafka::message::Headers;
    let headers = message.headers()?;
    headers
        .iter()
        .find(|h| h.key == name)
        .and_then(|h| h.value)
        .and_then(|v| std::str::from_utf8(v).ok())
}

fn poison(e: impl std::fmt::Display) -> Failure {
    Failure::poison(e.to_string())
}

impl Decode for ChatEvent {
    fn decode(message: &impl Message, schemas: &mut WriterSchemas) -> Result<Self, Failure> {
        let (writer, bytes) = schemas.framed(message)?;
        read_with(writer, bytes)
            .and_then(from_value)
            .map_err(poison)
    }
}

impl Decode for ReadReceipt {
    fn decode(message: &impl Message, schemas: &mut WriterSchemas) -> Result<Self, Failure> {
        let (writer, bytes) = schemas.framed(message)?;
        ReadReceipt::decode_with(writer, bytes).map_err(poison)
    }
}

impl Decode for chatpipe_schemas::ephemeral::Ephemeral {
    fn decode(message: &impl Message, schemas: &mut WriterSchemas) -> Result<Self, Failure> {
        let (writer, bytes) = schemas.framed(message)?;
        Self::decode_with(writer, bytes).map_err(poison)
    }
}

impl Decode for Listed {
    fn decode(message: &impl Message, schemas: &mut WriterSchemas) -> Result<Self, Failure> {
        let (writer, bytes) = schemas.framed(message)?;
        Listed::decode_with(writer, bytes).map_err(poison)
    }
}
