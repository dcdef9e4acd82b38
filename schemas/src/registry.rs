//! The schema registry (Confluent API; Apicurio serves it at `/apis/ccompat/v7`).
//! Services register their schemas at start and refuse to start when the registry
//! says a schema is incompatible with what is registered.

use std::sync::Arc;
use std::time::Duration;

use apache_avro::reader::datum::GenericDatumReader;
use schema_registry_converter::async_impl::avro::AvroDecoder;
use schema_registry_converter::async_impl::schema_registry::{
    is_compatible_schema, post_schema, SrSettings,
};
use schema_registry_converter::error::SRCError;
use schema_registry_converter::schema_registry_common::{SchemaType, SuppliedSchema};

use crate::avro::{from_value, split_frame, CodecError, EventCodec};
use crate::contract::{Compatibility, Contract, CHAT_EVENTS};
use crate::ChatEvent;

#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    #[error("schema registry at {url}: {source}")]
    Unreachable { url: String, source: SRCError },
    #[error(
        "the {subject} schema of this build is incompatible with the versions registered \
         ({level}); refusing to start. Evolve it compatibly (e.g. add fields with defaults)"
    )]
    Incompatible {
        subject: String,
        level: Compatibility,
    },
    #[error("setting {level} on {subject}: {detail}")]
    Config {
        subject: String,
        level: Compatibility,
        detail: String,
    },
    #[error("registry client: {0}")]
    Client(String),
}

/// Whether `err` is one no retry can mend: the schema itself is refused.
pub fn incompatible(err: &RegistryError) -> bool {
    matches!(err, RegistryError::Incompatible { .. })
}

/// How to reach a registry behind TLS with a private CA, or one that wants credentials
/// (HTTP basic, as Confluent's and Apicurio's do).
#[derive(Clone, Default)]
pub struct Access {
    /// PEM file of a CA to trust besides the system's (`https://` URLs).
    pub ca_file: Option<std::path::PathBuf>,
    pub username: Option<String>,
    pub password: Option<String>,
}

impl std::fmt::Debug for Access {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Access")
            .field("ca_file", &self.ca_file)
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "***"))
            .finish()
    }
}

/// What every HTTP client of one registry is built with: the CA (read once) and the
/// credentials.
struct ClientParts {
    ca: Option<reqwest::Certificate>,
    headers: reqwest::header::HeaderMap,
}

impl ClientParts {
    /// A client builder with the deadline, the extra CA and the credentials.
    fn builder(&self, timeout: Duration) -> reqwest::ClientBuilder {
        let mut builder = reqwest::Client::builder()
            .timeout(timeout)
            .no_proxy()
            .default_headers(self.headers.clone());
        if let Some(ca) = &self.ca {
            builder = builder.add_root_certificate(ca.clone());
        }
        builder
    }
}

/// `url` without user info, and `access` with it as HTTP basic credentials (those of
/// `access` win): a registry URL with a password in it is never kept, logged or put in
/// an error.
fn credentials_out_of(url: &str, access: &Access) -> Result<(String, Access), RegistryError> {
    let trimmed = url.trim_end_matches('/');
    let Ok(mut parsed) = reqwest::Url::parse(trimmed) else {
        return Ok((trimmed.to_owned(), access.clone()));
    };
    if parsed.username().is_empty() && parsed.password().is_none() {
        return Ok((trimmed.to_owned(), access.clone()));
    }
    let decode = |s: &str| {
        percent_encoding::percent_decode_str(s)
            .decode_utf8()
            .map(|d| d.into_owned())
            .map_err(|_| RegistryError::Client("registry.url: its user info is not UTF-8".into()))
    };
    let mut access = access.clone();
    if access.username.is_none() {
        access.username = Some(decode(parsed.username())?);
        access.password = parsed.password().map(decode).transpose()?;
    }
    let _ = parsed.set_username("");
    let _ = parsed.set_password(None);
    Ok((parsed.as_str().trim_end_matches('/').to_owned(), access))
}

impl Access {
    fn parts(&self) -> Result<ClientParts, RegistryError> {
        let ca = match &self.ca_file {
            None => None,
            Some(path) => {
                let pem = std::fs::read(path).map_err(|e| {
                    RegistryError::Client(format!("reading the CA file {}: {e}", path.display()))
                })?;
                Some(reqwest::Certificate::from_pem(&pem).map_err(|e| {
                    RegistryError::Client(format!("the CA file {}: {e}", path.display()))
                })?)
            }
        };
        let mut headers = reqwest::header::HeaderMap::new();
        if let Some(user) = &self.username {
            use base64::Engine;
            let pair = format!("{user}:{}", self.password.as_deref().unwrap_or_default());
            let value = format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode(pair)
            );
            let mut value = reqwest::header::HeaderValue::from_str(&value)
                .map_err(|e| RegistryError::Client(format!("registry credentials: {e}")))?;
            value.set_sensitive(true);
            headers.insert(reqwest::header::AUTHORIZATION, value);
        }
        Ok(ClientParts { ca, headers })
    }
}

/// Why a writer schema could not be had, sorted by what a consumer should do about it.
#[derive(Debug, Clone, thiserror::Error)]
pub enum LookupError {
    /// The registry answered 404: no schema has this id, so the record can never be
    /// read. Dead-letter it.
    #[error("the schema registry has no schema with id {0}")]
    NotFound(u32),
    /// The registry's answer for this id is not an Avro schema: the same.
    #[error("schema id {id} is not a readable Avro schema: {detail}")]
    Invalid { id: u32, detail: String },
    /// No answer, a timeout, or any status but 200 and 404: the registry is down or
    /// restarting. Wait and ask again; the record is fine.
    #[error("schema registry at {url} unavailable: {detail}")]
    Unavailable { url: String, detail: String },
}

impl LookupError {
    /// Whether asking again later may succeed.
    pub fn is_retriable(&self) -> bool {
        matches!(self, Self::Unavailable { .. })
    }
}

/// `e` and its sources, one line ("connection refused" hides two levels down in reqwest).
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

#[derive(Clone)]
pub struct Registry {
    url: String,
    settings: SrSettings,
    http: reqwest::Client,
    /// How long a consumer keeps asking for an id the registry answers 404 for before
    /// it condemns the record ([`Registry::with_unknown_id_grace`]).
    unknown_id_grace: Duration,
}

impl Registry {
    pub fn new(url: &str, timeout: Duration) -> Result<Self, RegistryError> {
        Self::with_access(url, timeout, &Access::default())
    }

    /// A registry at `url` (`http://` or `https://`) reached with `access`.
    pub fn with_access(
        url: &str,
        timeout: Duration,
        access: &Access,
    ) -> Result<Self, RegistryError> {
        let (url, access) = credentials_out_of(url, access)?;
        let parts = access.parts()?;
        let settings = SrSettings::new_builder(url.clone())
            .no_proxy()
            .set_timeout(timeout)
            .build_with(parts.builder(timeout))
            .map_err(|source| RegistryError::Unreachable {
                url: url.clone(),
                source,
            })?;
        let http = parts
            .builder(timeout)
            .build()
            .map_err(|e| RegistryError::Client(error_chain(&e)))?;
        Ok(Self {
            url,
            settings,
            http,
            unknown_id_grace: Duration::ZERO,
        })
    }

    /// A 404 for a writer schema's id is taken for a registry that does not know the id
    /// *yet* (restored from an old backup, a replica behind its primary) for `grace`
    /// after a consumer first met it; only then is the record poison.
    pub fn with_unknown_id_grace(mut self, grace: Duration) -> Self {
        self.unknown_id_grace = grace;
        self
    }

    /// [`Registry::with_unknown_id_grace`].
    pub fn unknown_id_grace(&self) -> Duration {
        self.unknown_id_grace
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    /// Registers a contract's value schema and returns its id. A schema already
    /// registered returns its existing id; an incompatible one is refused.
    pub async fn register(&self, contract: &Contract) -> Result<u32, RegistryError> {
        self.register_as(&contract.subject(), contract).await
    }

    /// The same under another subject: a namespaced topic (tests) or a shared registry.
    pub async fn register_as(
        &self,
        subject: &str,
        contract: &Contract,
    ) -> Result<u32, RegistryError> {
        self.register_schema(subject, contract.schema, contract.compatibility)
            .await
    }

    /// Registers `schema` under `subject`, held to `level` from then on.
    pub async fn register_schema(
        &self,
        subject: &str,
        schema: &str,
        level: Compatibility,
    ) -> Result<u32, RegistryError> {
        let supplied = || SuppliedSchema::new(None, SchemaType::Avro, schema.to_owned());
        // A new subject has nothing to be compatible with; the check errors with 404 then.
        if let Ok(false) =
            is_compatible_schema(&self.settings, subject.to_owned(), supplied()).await
        {
            return Err(RegistryError::Incompatible {
                subject: subject.to_owned(),
                level,
            });
        }
        let registered = post_schema(&self.settings, subject.to_owned(), supplied())
            .await
            .map_err(|source| {
                if source.error.contains("409")
                    || source.error.to_lowercase().contains("incompatible")
                {
                    RegistryError::Incompatible {
                        subject: subject.to_owned(),
                        level,
                    }
                } else {
                    RegistryError::Unreachable {
                        url: self.url.clone(),
                        source,
                    }
                }
            })?;
        self.hold_compatibility(subject, level).await?;
        tracing::info!(subject, id = registered.id, "schema registered");
        Ok(registered.id)
    }

    /// Pins the subject to `level`, whatever the registry's global default.
    async fn hold_compatibility(
        &self,
        subject: &str,
        level: Compatibility,
    ) -> Result<(), RegistryError> {
        let error = |detail: String| RegistryError::Config {
            subject: subject.to_owned(),
            level,
            detail,
        };
        let level = level.as_str();
        let url = format!("{}/config/{subject}", self.url);
        if self.compatibility_of(&url).await.as_deref() == Some(level) {
            return Ok(());
        }
        let res = self
            .http
            .put(&url)
            .header("content-type", "application/vnd.schemaregistry.v1+json")
            .body(format!("{{\"compatibility\":\"{level}\"}}"))
            .send()
            .await
            .map_err(|e| error(e.to_string()))?;
        // Two services starting at once may both create the rule; one gets a conflict.
        if res.status().is_success() || self.compatibility_of(&url).await.as_deref() == Some(level)
        {
            return Ok(());
        }
        Err(error(format!(
            "{} {}",
            res.status(),
            res.text().await.unwrap_or_default()
        )))
    }

    /// The subject's own compatibility level, if it has one.
    async fn compatibility_of(&self, config_url: &str) -> Option<String> {
        let res = self.http.get(config_url).send().await.ok()?;
        if !res.status().is_success() {
            return None;
        }
        let body: serde_json::Value = res.json().await.ok()?;
        body.get("compatibilityLevel")
            .or_else(|| body.get("compatibility"))?
            .as_str()
            .map(str::to_owned)
    }

    /// Registers the chat.read-receipts schema and returns a codec for it.
    pub async fn receipt_codec(&self) -> Result<crate::receipt::ReceiptCodec, RegistryError> {
        let id = self.register(&crate::contract::READ_RECEIPTS).await?;
        Ok(crate::receipt::ReceiptCodec::new(id))
    }

    /// Registers the receipt schema under `subject` (the delivery acks' topic carries the
    /// same records) and returns a codec for it.
    pub async fn receipt_codec_for(
        &self,
        subject: &str,
    ) -> Result<crate::receipt::ReceiptCodec, RegistryError> {
        let id = self
            .register_as(subject, &crate::contract::READ_RECEIPTS)
            .await?;
        Ok(crate::receipt::ReceiptCodec::new(id))
    }

    /// Registers the chat.ephemeral schema under `subject` and returns a codec for it.
    pub async fn ephemeral_codec_for(
        &self,
        subject: &str,
    ) -> Result<crate::ephemeral::EphemeralCodec, RegistryError> {
        let id = self
            .register_as(subject, &crate::contract::EPHEMERAL)
            .await?;
        Ok(crate::ephemeral::EphemeralCodec::new(id))
    }

    /// Registers the chat.presence schema under `subject` and returns a codec for it.
    pub async fn presence_codec_for(
        &self,
        subject: &str,
    ) -> Result<crate::presence::PresenceCodec, RegistryError> {
        let id = self
            .register_as(subject, &crate::contract::PRESENCE)
            .await?;
        Ok(crate::presence::PresenceCodec::new(id))
    }

    /// Registers the chat.deliveries schema under `subject` and returns a codec for it.
    pub async fn delivery_codec_for(
        &self,
        subject: &str,
    ) -> Result<crate::delivery::DeliveryCodec, RegistryError> {
        let id = self
            .register_as(subject, &crate::contract::DELIVERIES)
            .await?;
        Ok(crate::delivery::DeliveryCodec::new(id))
    }

    /// Registers the chat.notifications schema under `subject` and returns a codec.
    pub async fn notification_codec_for(
        &self,
        subject: &str,
    ) -> Result<crate::notification::NotificationCodec, RegistryError> {
        let id = self
            .register_as(subject, &crate::contract::NOTIFICATIONS)
            .await?;
        Ok(crate::notification::NotificationCodec::new(id))
    }

    /// Registers the chat.fanout-members schema under `subject` and returns a codec.
    pub async fn fanout_members_codec_for(
        &self,
        subject: &str,
    ) -> Result<crate::members::FanoutMembersCodec, RegistryError> {
        let id = self
            .register_as(subject, &crate::contract::FANOUT_MEMBERS)
            .await?;
        Ok(crate::members::FanoutMembersCodec::new(id))
    }

    /// Registers the chat.events schema under its subject (`chat.events-value`) and
    /// returns a codec for it.
    pub async fn event_codec(&self) -> Result<EventCodec, RegistryError> {
        self.event_codec_for(&CHAT_EVENTS.subject()).await
    }

    /// The same under another subject: a namespaced topic (tests) or a shared registry.
    pub async fn event_codec_for(&self, subject: &str) -> Result<EventCodec, RegistryError> {
        Ok(EventCodec::new(
            self.register_as(subject, &CHAT_EVENTS).await?,
        ))
    }

    /// The writer schema registered under `id` (`GET /schemas/ids/{id}`), with the
    /// answer classified for a consumer: only "no such id" and "not a schema" condemn
    /// the record; everything else (no answer, a timeout, any other status) is an outage
    /// to wait out. Not cached here: callers keep the schemas they got.
    pub async fn writer_schema(&self, id: u32) -> Result<apache_avro::Schema, LookupError> {
        let url = format!("{}/schemas/ids/{id}", self.url);
        let unavailable = |detail: String| LookupError::Unavailable {
            url: url.clone(),
            detail,
        };
        let res = self
            .http
            .get(&url)
            .send()
            .await
            .map_err(|e| unavailable(error_chain(&e)))?;
        let status = res.status();
        if status == reqwest::StatusCode::NOT_FOUND {
            return Err(LookupError::NotFound(id));
        }
        if !status.is_success() {
            let body = res.text().await.unwrap_or_default();
            return Err(unavailable(format!("{status} {}", body.trim())));
        }
        let body: serde_json::Value = res
            .json()
            .await
            .map_err(|e| unavailable(format!("reading the answer: {}", error_chain(&e))))?;
        let text =
            body.get("schema")
                .and_then(|s| s.as_str())
                .ok_or_else(|| LookupError::Invalid {
                    id,
                    detail: "the answer has no \"schema\" string".into(),
                })?;
        apache_avro::Schema::parse_str(text).map_err(|e| LookupError::Invalid {
            id,
            detail: e.to_string(),
        })
    }

    /// A decoder that reads chat.events records of any registered schema version.
    pub fn event_decoder(&self) -> EventDecoder {
        EventDecoder {
            writers: Arc::new(AvroDecoder::new(self.settings.clone())),
        }
    }
}

/// Decodes chat.events values of any registered version: the writer schema by the id
/// in the frame (fetched once from the registry, then cached).
#[derive(Clone)]
pub struct EventDecoder {
    writers: Arc<AvroDecoder>,
}

#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    #[error(transparent)]
    Codec(#[from] CodecError),
    #[error("resolving the writer schema: {0}")]
    Registry(#[from] SRCError),
}

impl EventDecoder {
    /// A chat.read-receipts value of any registered version.
    pub async fn decode_receipt(
        &self,
        bytes: &[u8],
    ) -> Result<crate::receipt::ReadReceipt, DecodeError> {
        let value = self.value(bytes).await?;
        Ok(crate::receipt::ReadReceipt::from_value(value)?)
    }

    /// The writer schema registered under `id` (fetched once, then cached).
    pub async fn writer_schema(&self, id: u32) -> Result<apache_avro::Schema, DecodeError> {
        Ok(self.writers.get_schema(id).await?.parsed.clone())
    }

    /// The record in the writer's schema, fetched by the id in the frame (cached).
    async fn value(&self, bytes: &[u8]) -> Result<apache_avro::types::Value, DecodeError> {
        let (id, body) = split_frame(bytes)?;
        let writer = self.writers.get_schema(id).await?;
        let value = GenericDatumReader::builder(&writer.parsed)
            .build()
            .and_then(|reader| reader.read_value(&mut &body[..]))
            .map_err(CodecError::from)?;
        Ok(value)
    }

    /// A chat.events value of any registered version. Read with the writer's schema and
    /// mapped by field name (`from_value`): apache-avro's schema resolution matches union
    /// branches by shape, and MemberJoined's fields are a superset of ReadUpdated's, so it
    /// would pick the wrong branch. By name, a newer writer's extra fields are ignored and
    /// an older writer's missing optional fields read as absent, as BACKWARD_TRANSITIVE
    /// promises.
    pub async fn decode(&self, bytes: &[u8]) -> Result<ChatEvent, DecodeError> {
        Ok(from_value(self.value(bytes).await?)?)
    }
}

#[cfg(test)]
mod credentials_tests {
    use super::*;

    #[test]
    fn credentials_in_the_url_become_basic_auth_and_leave_the_url() {
        let (url, access) = credentials_out_of(
            "https://svc:p%40ss@reg.example:8443/apis/ccompat/v7/",
            &Access::default(),
        )
        .unwrap();
        assert_eq!(url, "https://reg.example:8443/apis/ccompat/v7");
        assert_eq!(access.username.as_deref(), Some("svc"));
        assert_eq!(access.password.as_deref(), Some("p@ss"));
        let registry = Registry::new(
            "https://svc:p%40ss@reg.example/apis",
            Duration::from_secs(1),
        )
        .unwrap();
        assert_eq!(registry.url(), "https://reg.example/apis");
        assert!(!format!("{access:?}").contains("p@ss"));
    }

    #[test]
    fn configured_credentials_win_and_a_plain_url_is_kept() {
        let given = Access {
            username: Some("cfg".into()),
            password: Some("cfg-pw".into()),
            ..Access::default()
        };
        let (url, access) = credentials_out_of("http://u:p@reg/x", &given).unwrap();
        assert_eq!(url, "http://reg/x");
        assert_eq!(access.username.as_deref(), Some("cfg"));
        let (url, _) = credentials_out_of("http://reg/x", &Access::default()).unwrap();
        assert_eq!(url, "http://reg/x");
    }
}
