//! ingest-api against the real PostgreSQL: one fresh database per test.

mod auth;
mod bad_input;
mod bounds;
mod consent;
mod conversations;
mod deletes;
mod delivered;
mod demo;
mod demo_limits;
mod edits;
mod group_commit;
mod inbox;
mod jwks;
mod least_privilege;
mod limits;
mod migrations;
mod nonmembers;
mod operations;
mod read_limits;
mod reads;
mod schema_contract;
mod send;
mod sync;
mod sync_origin;
mod sync_pages;
mod watchdog;
