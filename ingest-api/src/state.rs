//! What every handler can reach, built once by `startup` and cloned into each request.

use std::sync::Arc;
use std::time::{Duration, Instant};

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
    pub ready: Arc<ReadyCache>,
    /// `Some` in demo mode (`demo.enabled`): the `/app` client and `/demo/token`.
    pub demo: Option<Arc<DemoSettings>>,
}

/// The public `/readyz`'s last answer, kept for [`ReadyCache::TTL`]: a caller without a
/// token makes at most one database round trip a second, however often it asks. Callers
/// that find it stale wait for one probe together.
#[derive(Default)]
pub struct ReadyCache(tokio::sync::Mutex<Option<(Instant, bool)>>);

impl ReadyCache {
    pub const TTL: Duration = Duration::from_secs(1);

    /// The last answer while it is fresh, else `probe`'s.
    pub async fn get(&self, probe: impl std::future::Future<Output = bool>) -> bool {
        let mut last = self.0.lock().await;
        if let Some((at, ready)) = *last {
            if at.elapsed() < Self::TTL {
                return ready;
            }
        }
        let ready = probe.await;
        metrics::counter!("readyz_probes_total").increment(1);
        *last = Some((Instant::now(), ready));
        ready
    }
}
