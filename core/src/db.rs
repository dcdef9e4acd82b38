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

/// `database.url`'s value when none is configured: no credentials are compiled in, so a
/// service without one refuses to start ([`connect_options`] names the key).
pub fn no_url() -> secrecy::SecretString {
    secrecy::SecretString::from("")
}

/// The connect options of `database.url` for a pool of service `application`. An empty
/// URL is an error naming the key and its variable, a malformed one names them too; the
/// URL itself (with its password) is never in the message.
pub fn connect_options(
    url: &secrecy::SecretString,
    application: &str,
) -> Result<sqlx::postgres::PgConnectOptions, UrlError> {
    use secrecy::ExposeSecret;
    let url = url.expose_secret();
    if url.trim().is_empty() {
        return Err(UrlError::Missing);
    }
    url.parse::<sqlx::postgres::PgConnectOptions>()
        .map(|options| options.application_name(application))
        .map_err(|err| UrlError::Malformed(crate::redact::text(&err.to_string(), url)))
}

#[derive(Debug, thiserror::Error)]
pub enum UrlError {
    #[error(
        "database.url (DATABASE_URL) is not set: give the PostgreSQL URL of a login role \
         that is a member of chatpipe_service (docs/operations.md, \"Database roles\")"
    )]
    Missing,
    #[error("database.url (DATABASE_URL) is not a PostgreSQL URL: {0}")]
    Malformed(String),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_url_names_the_key() {
        let err = connect_options(&no_url(), "x").unwrap_err().to_string();
        assert!(
            err.starts_with("database.url (DATABASE_URL) is not set"),
            "{err}"
        );
    }

    #[test]
    fn a_malformed_url_is_refused_without_its_password() {
        let url = secrecy::SecretString::from("postgres://u:hunter2@[::1/db");
        let err = connect_options(&url, "x").unwrap_err().to_string();
        assert!(err.contains("database.url"), "{err}");
        assert!(!err.contains("hunter2"), "{err}");
    }
}
