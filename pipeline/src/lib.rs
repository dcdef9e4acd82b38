//! chatpipe's stream processors, and tools to look at the streams.

pub mod receipts;
pub mod settings;
pub mod tail;
