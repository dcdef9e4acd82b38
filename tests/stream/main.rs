//! The outbox through Debezium to chat.events, against the real stack
//! (`scripts/stack up`): PostgreSQL, Kafka, Kafka Connect with Debezium, the registry.

mod acls;
mod analytics;
mod archive;
mod audit;
mod cdc;
mod membership_race;
mod read_membership;
mod receipts;
mod republish;
mod slots;
mod tiers;
mod transports;
