//! SQL lives here and only here. Every function that changes state writes its events to
//! the outbox inside the same transaction.

pub mod conversations;
pub mod inbox;
pub mod messages;
pub mod reads;

pub use chatpipe_core::outbox::Outbox;
use sqlx::PgPool;

/// The database and the outbox: what every store function needs.
#[derive(Clone)]
pub struct Store {
    pub pool: PgPool,
    pub outbox: Outbox,
}

pub use chatpipe_core::outbox::now;
