//! Typed values out of PostgreSQL rows.

/// An id, seq or watermark from a column the schema keeps in range (CHECK constraints,
/// sequences). A value out of range is a decoding error, as a column of the wrong type
/// would be.
pub fn id<T>(value: i64) -> Result<T, sqlx::Error>
where
    T: TryFrom<i64>,
    T::Error: std::error::Error + Send + Sync + 'static,
{
    T::try_from(value).map_err(|e| sqlx::Error::Decode(Box::new(e)))
}

/// How long a COMMIT waits before it returns: PostgreSQL's `synchronous_commit`, set by
/// our services on every connection they open (`database.synchronous_commit`), whatever
/// the server's or the database's default. A 201, or an offset committed after a flush,
/// promises that the rows survive a crash (invariant 3), so `off` is not offered: with
/// it a crash can lose commits that were already acknowledged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SynchronousCommit {
    /// The WAL is flushed locally (and, with synchronous standbys, on them).
    On,
    /// Flushed locally, and written (not yet flushed) by the synchronous standbys.
    RemoteWrite,
    /// Flushed locally, and applied by the synchronous standbys (readable there).
    RemoteApply,
}

impl SynchronousCommit {
    pub fn setting(self) -> &'static str {
        match self {
            Self::On => "on",
            Self::RemoteWrite => "remote_write",
            Self::RemoteApply => "remote_apply",
        }
    }

    /// `options` with this level set in the connection's startup packet, which takes
    /// precedence over the server's and the database's defaults.
    pub fn apply(
        self,
        options: sqlx::postgres::PgConnectOptions,
    ) -> sqlx::postgres::PgConnectOptions {
        options.options([("synchronous_commit", self.setting())])
    }
}
