//! ingest-api: the REST front door of chatpipe. See docs/api.md for the contract.

pub mod configuration;
pub mod domain;
pub mod error;
pub mod extract;
pub mod openapi;
pub mod rate;
pub mod receipts;
pub mod routes;
pub mod startup;
pub mod state;
pub mod store;
