//! Layered configuration: the defaults file compiled into the binary, then an optional
//! file given at start, then environment variables. Unknown keys are an error (each
//! service's config structs use `deny_unknown_fields`).

use std::path::Path;

use figment::providers::{Env, Format, Toml};
use figment::Figment;
use serde::de::DeserializeOwned;
use serde::Deserialize;

/// Loads a service's config.
///
/// * `defaults` — the service's defaults file (TOML), usually `include_str!`-ed.
/// * `file` — an operator's file that overrides the defaults.
/// * `aliases` — well-known variables mapped onto keys, e.g. `("DATABASE_URL", "database.url")`.
/// * every `CHATPIPE_SECTION__KEY` variable overrides `section.key`.
///
/// The error lists every problem (unknown key, wrong type, missing value) with its source.
pub fn load<T: DeserializeOwned>(
    defaults: &str,
    file: Option<&Path>,
    aliases: &[(&str, &str)],
) -> Result<T, Box<figment::Error>> {
    let mut figment = Figment::from(Toml::string(defaults));
    if let Some(path) = file {
        if !path.exists() {
            return Err(Box::new(figment::Error::from(format!(
                "config file {} does not exist",
                path.display()
            ))));
        }
        figment = figment.merge(Toml::file(path));
    }
    // Only CHATPIPE_SECTION__KEY: other CHATPIPE_* variables (the stack's own) are not ours.
    figment = figment.merge(
        Env::prefixed("CHATPIPE_")
            .filter(|k| k.as_str().contains("__"))
            .split("__"),
    );
    for (var, key) in aliases {
        if let Ok(value) = std::env::var(var) {
            figment = figment.merge((*key, value));
        }
    }
    figment.extract().map_err(Box::new)
}

/// `[registry]`: the schema registry every service registers its schemas with.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RegistrySettings {
    /// The Confluent-compatible API (Apicurio: `.../apis/ccompat/v7`).
    pub url: String,
    pub timeout_ms: u64,
    /// The subject of the chat.events value schema (TopicNameStrategy: `<topic>-value`).
    #[serde(default = "default_events_subject")]
    pub events_subject: String,
    /// How long a service starting before the registry waits for it (retrying) before
    /// it gives up and exits.
    #[serde(default = "default_startup_wait_ms")]
    pub startup_wait_ms: u64,
    /// A CA (PEM) to trust for an `https://` registry, besides the system's.
    #[serde(default)]
    pub ca_file: Option<std::path::PathBuf>,
    /// HTTP basic credentials, sent with every request.
    #[serde(default)]
    pub username: Option<String>,
    #[serde(default)]
    pub password: Option<secrecy::SecretString>,
    /// How long a consumer asks again for a writer schema id the registry answers 404
    /// for, before the record is dead-lettered (a registry restored from an old backup,
    /// or a replica behind, knows the id a little later).
    #[serde(default = "default_unknown_id_grace_ms")]
    pub unknown_id_grace_ms: u64,
}

fn default_unknown_id_grace_ms() -> u64 {
    300_000
}

impl RegistrySettings {
    /// The registry client these settings describe.
    pub fn connect(
        &self,
    ) -> Result<chatpipe_schemas::registry::Registry, chatpipe_schemas::registry::RegistryError>
    {
        use secrecy::ExposeSecret;
        chatpipe_schemas::registry::Registry::with_access(
            &self.url,
            std::time::Duration::from_millis(self.timeout_ms),
            &chatpipe_schemas::registry::Access {
                ca_file: self.ca_file.clone(),
                username: self.username.clone(),
                password: self.password.as_ref().map(|p| p.expose_secret().to_owned()),
            },
        )
        .map(|r| {
            r.with_unknown_id_grace(std::time::Duration::from_millis(self.unknown_id_grace_ms))
        })
    }
}

fn default_events_subject() -> String {
    "chat.events-value".into()
}

fn default_startup_wait_ms() -> u64 {
    300_000
}

impl RegistrySettings {
    /// [`Self::startup_wait_ms`].
    pub fn startup_wait(&self) -> std::time::Duration {
        std::time::Duration::from_millis(self.startup_wait_ms)
    }
}

/// `[admin]`: the operators' listener of a service (`/metrics`, `/readyz` with the cause).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdminSettings {
    pub addr: std::net::SocketAddr,
}

/// `[kafka]` of the services that only need to find the brokers.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KafkaSettings {
    pub brokers: String,
    /// librdkafka properties set on every client, after ours: how to reach a secured
    /// cluster (`security.protocol`, `sasl.*`, `ssl.*`). See [`crate::kafka::apply`].
    #[serde(default)]
    pub properties: crate::kafka::Properties,
}

impl KafkaSettings {
    /// [`crate::kafka::producer_config`] with [`Self::properties`].
    pub fn producer(&self) -> rdkafka::ClientConfig {
        crate::kafka::apply(
            crate::kafka::producer_config(&self.brokers),
            &self.properties,
        )
    }

    /// [`crate::kafka::client_config`] with [`Self::properties`].
    pub fn client(&self) -> rdkafka::ClientConfig {
        crate::kafka::apply(crate::kafka::client_config(&self.brokers), &self.properties)
    }

    /// [`crate::kafka::consumer_config`] with [`Self::properties`].
    pub fn consumer(&self, group: &str) -> rdkafka::ClientConfig {
        crate::kafka::apply(
            crate::kafka::consumer_config(&self.brokers, group),
            &self.properties,
        )
    }
}

/// `[outbox]`: how a service writes its events.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OutboxSettings {
    /// Keep each row until the auditor has seen its event on `chat.events` (it then
    /// deletes confirmed rows in batches), so that events whose WAL was lost can be
    /// published again (docs/operations.md, "Re-publishing the outbox"). False: delete
    /// each row in the transaction that wrote it (the WAL keeps the insert), for a
    /// deployment that runs no auditor.
    pub retain_until_confirmed: bool,
}
