//! The line between an outage and a bad record. Everything a reader does ends in one of
//! three ways: done, [`Failure::Retriable`] (the broker, the registry or the database
//! did not answer: wait, then try the same record again, holding its offset) or
//! [`Failure::Poison`] (the record itself can never be processed: dead-letter it and go
//! on). An outage is never dead-lettered, and a bad record never stalls a partition.

use chatpipe_schemas::registry::LookupError;

#[derive(Debug)]
pub enum Failure {
    /// Something we depend on is down, slow or restarting. Retried with backoff.
    Retriable(anyhow::Error),
    /// The record is bad (not Confluent-framed, an unknown schema id, bytes that do not
    /// decode with their writer schema, values out of range).
    Poison(String),
}

impl Failure {
    pub fn retriable(error: impl Into<anyhow::Error>) -> Self {
        Self::Retriable(error.into())
    }

    pub fn poison(reason: impl Into<String>) -> Self {
        Self::Poison(reason.into())
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Retriable(e) => write!(f, "retriable: {e:#}"),
            Self::Poison(reason) => write!(f, "poison: {reason}"),
        }
    }
}

impl From<LookupError> for Failure {
    fn from(e: LookupError) -> Self {
        if e.is_retriable() {
            Self::Retriable(e.into())
        } else {
            Self::Poison(e.to_string())
        }
    }
}

/// Every database error is an outage from a reader's point of view: the statements are
/// ours and the values were validated when the record was decoded, so what fails is the
/// connection, the server restarting, or a pool that cannot connect.
#[cfg(feature = "sqlx")]
impl From<sqlx::Error> for Failure {
    fn from(e: sqlx::Error) -> Self {
        Self::Retriable(e.into())
    }
}

/// Kafka errors met while processing (producing a list, committing) are outages.
impl From<rdkafka::error::KafkaError> for Failure {
    fn from(e: rdkafka::error::KafkaError) -> Self {
        Self::Retriable(e.into())
    }
}
