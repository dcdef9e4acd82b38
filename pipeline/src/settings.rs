use std::path::Path;

use serde::Deserialize;

const DEFAULTS: &str = include_str!("../../config/pipeline.toml");

const ALIASES: &[(&str, &str)] = &[
    ("KAFKA_BROKERS", "kafka.brokers"),
    ("SCHEMA_REGISTRY_URL", "registry.url"),
];

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    pub kafka: KafkaSettings,
    pub registry: RegistrySettings,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KafkaSettings {
    pub brokers: String,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RegistrySettings {
    pub url: String,
    pub timeout_ms: u64,
}

impl Settings {
    pub fn load(file: Option<&Path>) -> Result<Self, Box<figment::Error>> {
        chatpipe_core::config::load(DEFAULTS, file, ALIASES)
    }
}
