//! The outbox through Debezium to chat.events, against the real stack
//! (`scripts/stack up`): PostgreSQL, Kafka, Kafka Connect with Debezium, the registry.

mod audit;
mod cdc;
mod membership_race;
mod receipts;
mod transports;
