//! The cold tier as a service reaches it, connected on first use.

use std::time::Duration;

use super::{Cold, Schema, StorageSettings};

/// The cold tier as a service reaches it: connected on first use, so a process starts
/// (and serves everything that does not need Cassandra) while Cassandra is down. Once
/// connected, the driver reconnects by itself. After a failed connect the next attempt
/// waits [`ColdTier::RECONNECT_AFTER`]: callers meanwhile get the error at once.
#[derive(Clone)]
pub struct ColdTier {
    settings: StorageSettings,
    schema: Schema,
    cell: std::sync::Arc<tokio::sync::OnceCell<Cold>>,
    failed_at: std::sync::Arc<std::sync::Mutex<Option<std::time::Instant>>>,
}

impl ColdTier {
    pub const RECONNECT_AFTER: Duration = Duration::from_secs(1);

    pub fn new(settings: &StorageSettings, schema: Schema) -> Self {
        Self {
            settings: settings.clone(),
            schema,
            cell: Default::default(),
            failed_at: Default::default(),
        }
    }

    pub fn settings(&self) -> &StorageSettings {
        &self.settings
    }

    /// The session, connecting now if there is none yet.
    pub async fn get(&self) -> anyhow::Result<&Cold> {
        if let Some(cold) = self.cell.get() {
            return Ok(cold);
        }
        let failed_at = *self.failed_at.lock().expect("not poisoned");
        if let Some(at) = failed_at.filter(|at| at.elapsed() < Self::RECONNECT_AFTER) {
            anyhow::bail!(
                "Cassandra ({}) did not answer {} ms ago",
                self.settings.cassandra_nodes,
                at.elapsed().as_millis()
            );
        }
        let opened = self
            .cell
            .get_or_try_init(|| Cold::open(&self.settings, self.schema))
            .await;
        if opened.is_err() {
            *self.failed_at.lock().expect("not poisoned") = Some(std::time::Instant::now());
        }
        opened
    }
}
