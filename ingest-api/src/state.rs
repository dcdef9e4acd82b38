//! What every handler can reach, built once by `startup` and cloned into each request.

use std::sync::Arc;

use chatpipe_core::auth::TokenKeys;
use chatpipe_core::telemetry::PrometheusHandle;

use crate::configuration::Limits;
use crate::configuration::{DemoSettings, SyncBounds};
use crate::rate::RateLimits;
use crate::receipts::ReceiptProducer;
use crate::store::send::SendQueue;
use crate::store::sync::CursorKey;
use crate::store::Store;

/// What every handler can reach.
#[derive(Clone)]
pub struct AppState {
    pub store: Store,
    /// The send path's lanes (group commit per conversation).
    pub sends: SendQueue,
    /// Shared: axum clones the state for every request.
    pub keys: Arc<TokenKeys>,
    pub limits: Arc<Limits>,
    pub max_request_bytes: usize,
    pub metrics: PrometheusHandle,
    /// Per-user token buckets for sends, creations and member changes.
    pub rate: RateLimits,
    /// `Some` when `reads.mode = "stream"`.
    pub receipts: Option<ReceiptProducer>,
    /// Signs and checks `GET /sync` cursors.
    pub cursors: CursorKey,
    /// How much one `GET /sync` answer holds.
    pub sync_bounds: SyncBounds,
    /// The public `/readyz`'s last answer.
    pub ready: Arc<crate::routes::health::ReadyCache>,
    /// `Some` in demo mode (`demo.enabled`): the `/app` client and `/demo/token`.
    pub demo: Option<Arc<DemoSettings>>,
}
