//! chatpipe's stream processors, and tools to look at the streams.

pub mod fanout;
pub mod receipts;
pub mod settings;
pub mod streams;
pub mod tail;
