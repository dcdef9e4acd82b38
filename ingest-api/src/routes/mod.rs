//! HTTP handlers: parse and validate, call the store, shape the answer.

pub mod conversations;
pub mod health;
pub mod inbox;
pub mod messages;
pub mod reads;
