//! chatpipe's stream processors, and tools to look at the streams.

pub mod settings;
pub mod tail;
