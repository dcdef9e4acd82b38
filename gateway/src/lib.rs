//! The WebSocket gateway. Clients connect to `GET /ws` with the same JWT as the REST
//! API; the gateway keeps a session per connection (several per user), tells
//! chat.presence which users it holds ([`presence`]), and pushes the fanout lists of its
//! chat.deliveries partition to them ([`deliveries`]); a new session is told `ready` once
//! its pushes are live ([`ready`]).

pub mod client;
pub mod configuration;
pub mod connection;
pub mod deliveries;
pub mod frames;
pub mod presence;
pub mod ready;
pub mod resync;
pub mod routes;
pub mod sessions;
pub mod signals;
pub mod startup;

pub use configuration::{Settings, ALIASES};
pub use frames::Frame;
pub use routes::{Gateway, SUBPROTOCOL};
pub use sessions::Sessions;
pub use startup::{admin_listener, listener, run};
