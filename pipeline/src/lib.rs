//! chatpipe's stream processors, and tools to look at the streams.

pub mod analytics;
pub mod archive;
pub mod audit;
pub mod fanout;
pub mod notify;
pub mod receipts;
pub mod redrive;
pub mod settings;
pub mod tail;
