//! docker-compose.yml cannot be started here (no Docker engine), so what can be checked
//! without one is checked: every variable our services are given is one they read (a
//! known alias, or `CHATPIPE_<SECTION>__<KEY>` naming a real key, which each binary's
//! `check-config` loads with the compose values); the start order that keeps writes from
//! being lost; persistent registry storage; one database name; a host listener for Kafka.

use std::collections::BTreeMap;

use serde_yaml_ng::Value;

use crate::repo_root;

fn compose() -> Value {
    load("docker-compose.yml")
}

fn load(file: &str) -> Value {
    let text = std::fs::read_to_string(repo_root().join(file)).unwrap();
    let mut doc: Value =
        serde_yaml_ng::from_str(&text).unwrap_or_else(|e| panic!("{file} is YAML: {e}"));
    doc.apply_merge()
        .unwrap_or_else(|e| panic!("{file}: its merge keys resolve: {e}"));
    doc
}

/// `docker compose -f docker-compose.yml -f docker-compose.cluster.yml`.
fn cluster_compose() -> Value {
    compose_with("docker-compose.cluster.yml")
}

/// `docker compose -f docker-compose.yml -f <file>`, as compose merges them: mappings key
/// by key, anything else replaced by the override.
fn compose_with(file: &str) -> Value {
    fn merge(base: &mut Value, over: &Value) {
        match (base, over) {
            (Value::Mapping(b), Value::Mapping(o)) => {
                for (k, v) in o {
                    match b.get_mut(k) {
                        Some(existing) => merge(existing, v),
                        None => {
                            b.insert(k.clone(), v.clone());
                        }
                    }
                }
            }
            (b, o) => *b = o.clone(),
        }
    }
    let mut doc = compose();
    merge(&mut doc, &load(file));
    doc
}

/// A service's environment, `${VAR:?…}` given a value (a 32-byte secret) and
/// `${VAR:-default}` its default.
fn environment(service: &Value) -> BTreeMap<String, String> {
    let mut env = BTreeMap::new();
    if let Some(map) = service["environment"].as_mapping() {
        for (k, v) in map {
            let value = match v {
                Value::String(s) => s.clone(),
                Value::Number(n) => n.to_string(),
                Value::Bool(b) => b.to_string(),
                other => panic!("{k:?}: {other:?}"),
            };
            let value = if value.starts_with("${") && value.contains(":?") {
                "compose-check-secret-0123456789abcdef".to_owned()
            } else if let Some(rest) = value.strip_prefix("${").and_then(|v| v.strip_suffix('}')) {
                rest.split_once(":-")
                    .map(|(_, d)| d.to_owned())
                    .unwrap_or_default()
            } else {
                value
            };
            env.insert(k.as_str().unwrap().to_owned(), value);
        }
    }
    env
}

/// Which of our binaries a service runs, and the variables that binary reads.
fn binary(service: &Value) -> (&'static str, &'static [(&'static str, &'static str)]) {
    let first = service["entrypoint"][0].as_str().unwrap_or("ingest-api");
    match first {
        "ingest-api" => (
            "CHATPIPE_INGEST_API_BIN",
            ingest_api::configuration::ALIASES,
        ),
        "pipeline" => ("CHATPIPE_PIPELINE_BIN", pipeline::settings::ALIASES),
        "gateway" => ("CHATPIPE_GATEWAY_BIN", gateway::ALIASES),
        other => panic!("unknown entrypoint {other}"),
    }
}

/// Variables every binary reads besides its config: the log format and filter.
const LOGGING: &[&str] = &["LOG_FORMAT", "RUST_LOG"];

#[test]
fn every_variable_of_our_services_is_one_they_read_and_their_config_loads() {
    for (file, doc) in [
        ("docker-compose.yml", compose()),
        (
            "+ docker-compose.demo.yml",
            compose_with("docker-compose.demo.yml"),
        ),
    ] {
        let checked = check_services(&doc);
        assert!(checked >= 6, "{file}: {checked} of our services checked");
    }
}

/// Demo mode only with its own file: the default file has none of it, and the demo file
/// turns it on for ingest-api (on its compose address, so it must allow that) and the
/// gateway's acceptance of demo tokens.
#[test]
fn demo_mode_is_on_only_with_the_demo_file() {
    let base = compose();
    for (name, service) in base["services"].as_mapping().unwrap() {
        let demo: Vec<String> = environment(service)
            .into_keys()
            .filter(|k| k.contains("DEMO"))
            .collect();
        assert!(demo.is_empty(), "{name:?} in docker-compose.yml: {demo:?}");
    }
    let demo = compose_with("docker-compose.demo.yml");
    let api = environment(&demo["services"]["ingest-api"]);
    assert_eq!(api["CHATPIPE_DEMO__ENABLED"], "true");
    assert_eq!(api["CHATPIPE_DEMO__ALLOW_REMOTE"], "true");
    let gateway = environment(&demo["services"]["gateway"]);
    assert_eq!(gateway["CHATPIPE_AUTH__ACCEPT_DEMO_TOKENS"], "true");
}

/// Checks each of our services in `doc`; says how many.
fn check_services(doc: &Value) -> usize {
    let mut checked = 0;
    for (name, service) in doc["services"].as_mapping().unwrap() {
        let name = name.as_str().unwrap();
        if service.get("build").is_none() {
            continue;
        }
        let (bin_var, aliases) = binary(service);
        let env = environment(service);
        for var in env.keys() {
            let known = aliases.iter().any(|(alias, _)| alias == var)
                || LOGGING.contains(&var.as_str())
                || var
                    .strip_prefix("CHATPIPE_")
                    .is_some_and(|rest| rest.contains("__"));
            assert!(known, "{name}: {var} is read by nothing ({bin_var})");
        }
        // The binary loads its configuration from exactly these variables: an unknown
        // CHATPIPE_ key or a value of the wrong type fails.
        let bin = std::env::var(bin_var).unwrap_or_else(|_| {
            panic!(
                "{bin_var} is not set: run the suite with scripts/test, which builds the services"
            )
        });
        let out = std::process::Command::new(&bin)
            .arg("check-config")
            .env_clear()
            .envs(&env)
            .output()
            .expect("the binary runs");
        assert!(
            out.status.success(),
            "{name}: its compose environment does not load:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        checked += 1;
    }
    checked
}

#[test]
fn writes_start_only_after_the_connector_runs_and_everything_waits_for_health() {
    let doc = compose();
    let services = &doc["services"];
    let after = |service: &str, dependency: &str| {
        services[service]["depends_on"][dependency]["condition"]
            .as_str()
            .unwrap_or_else(|| panic!("{service} does not wait for {dependency}"))
            .to_owned()
    };
    // Writes committed before the replication slot exists never reach chat.events.
    assert_eq!(
        after("ingest-api", "connector"),
        "service_completed_successfully"
    );
    let connector = serde_yaml_ng::to_string(&services["connector"]).unwrap();
    assert!(
        connector.contains("RUNNING"),
        "the connector job waits for its task to run"
    );
    assert_eq!(after("connector", "connect"), "service_healthy");
    assert_eq!(
        after("connector", "migrate"),
        "service_completed_successfully"
    );
    for (service, dependency) in [
        ("ingest-api", "registry"),
        ("receipts", "registry"),
        ("fanout", "registry"),
        ("gateway", "registry"),
        ("topics", "kafka"),
        ("registry", "postgres"),
        ("migrate", "postgres"),
    ] {
        assert_eq!(
            after(service, dependency),
            "service_healthy",
            "{service} -> {dependency}"
        );
    }
    for (name, service) in services.as_mapping().unwrap() {
        let name = name.as_str().unwrap();
        let long_running = service.get("build").is_some()
            && service["restart"].as_str() != Some("no")
            || ["postgres", "kafka", "registry", "connect"].contains(&name);
        if long_running {
            assert_eq!(
                service["restart"].as_str(),
                Some("unless-stopped"),
                "{name} restarts"
            );
            assert!(
                service.get("healthcheck").is_some() || name == "audit",
                "{name} has a health check"
            );
        }
    }
}

#[test]
fn registry_storage_persists_kafka_has_a_host_listener_and_one_database_name_is_used() {
    let doc = compose();
    let services = &doc["services"];
    let registry = environment(&services["registry"]);
    assert_eq!(
        registry.get("APICURIO_STORAGE_KIND").map(String::as_str),
        Some("sql")
    );
    assert!(registry["APICURIO_DATASOURCE_URL"].starts_with("jdbc:postgresql://"));
    let kafka = environment(&services["kafka"]);
    assert!(kafka["KAFKA_ADVERTISED_LISTENERS"].contains("127.0.0.1:9092"));
    let ports = serde_yaml_ng::to_string(&services["kafka"]["ports"]).unwrap();
    assert!(ports.contains("9092:9092"), "{ports}");

    // One database name: compose, the connector file, and every service's default.
    let mut names = std::collections::BTreeSet::new();
    for (_, service) in services.as_mapping().unwrap() {
        for (var, value) in environment(service) {
            if var == "DATABASE_URL" || var == "POSTGRES_DB" || var == "CHATPIPE_PG_DB" {
                names.insert(value.rsplit('/').next().unwrap().to_owned());
            }
        }
    }
    // No credentials compiled in: the services' defaults name no database at all.
    for config in ["config/ingest-api.toml", "config/pipeline.toml"] {
        let text = std::fs::read_to_string(repo_root().join(config)).unwrap();
        assert!(
            !text
                .lines()
                .any(|l| l.trim_start().starts_with("url = \"postgres://")),
            "{config} has a database URL (with credentials) among its defaults"
        );
    }
    assert_eq!(names.into_iter().collect::<Vec<_>>(), ["chatpipe"]);

    let ignore = std::fs::read_to_string(repo_root().join(".dockerignore"))
        .expect("a .dockerignore keeps target/ and .stack/ out of the build context");
    for path in ["target", ".stack", ".git"] {
        assert!(
            ignore.lines().any(|l| l.trim() == path),
            ".dockerignore lacks {path}"
        );
    }
}

/// Least privilege in compose as in scripts/stack: the services log in as
/// chatpipe_service, Debezium as chatpipe_cdc, the registry as a role owning only its own
/// database; only the one-shot `migrate` (the schema's owner) uses the superuser.
#[test]
fn compose_logs_every_part_in_with_its_own_role() {
    let doc = compose();
    let services = &doc["services"];
    for (name, service) in services.as_mapping().unwrap() {
        let name = name.as_str().unwrap();
        let env = environment(service);
        if let Some(url) = env.get("DATABASE_URL") {
            let user = url.split("://").nth(1).unwrap().split(':').next().unwrap();
            let want = if name == "migrate" {
                "postgres"
            } else {
                "chatpipe_service"
            };
            assert_eq!(user, want, "{name}'s DATABASE_URL");
        }
    }
    let connect = environment(&services["connect"]);
    assert_eq!(connect["CHATPIPE_CDC_USER"], "chatpipe_cdc");
    let registry = environment(&services["registry"]);
    assert_eq!(
        registry["APICURIO_DATASOURCE_USERNAME"],
        "chatpipe_registry"
    );
    let volumes = serde_yaml_ng::to_string(&services["postgres"]["volumes"]).unwrap();
    assert!(volumes.contains("config/postgres/roles.sql"), "{volumes}");
}

#[test]
fn the_cluster_override_runs_three_brokers_two_workers_and_replicates_every_durable_topic() {
    let doc = cluster_compose();
    let services = &doc["services"];
    let nodes = ["kafka", "kafka-2", "kafka-3"];
    let mut ids = Vec::new();
    for node in nodes {
        let env = environment(&services[node]);
        ids.push(env["KAFKA_NODE_ID"].clone());
        assert_eq!(
            env["KAFKA_CONTROLLER_QUORUM_VOTERS"], "1@kafka:9093,2@kafka-2:9093,3@kafka-3:9093",
            "{node}: one quorum of the three"
        );
        for (key, want) in [
            ("KAFKA_DEFAULT_REPLICATION_FACTOR", "3"),
            ("KAFKA_MIN_INSYNC_REPLICAS", "2"),
            ("KAFKA_UNCLEAN_LEADER_ELECTION_ENABLE", "false"),
            ("KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR", "3"),
            ("KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR", "3"),
            ("KAFKA_TRANSACTION_STATE_LOG_MIN_ISR", "2"),
        ] {
            assert_eq!(env[key], want, "{node}: {key}");
        }
        assert!(
            env["KAFKA_ADVERTISED_LISTENERS"].contains(&format!("INTERNAL://{node}:19092")),
            "{node} advertises itself"
        );
    }
    assert_eq!(ids, ["1", "2", "3"]);
    let topics = serde_yaml_ng::to_string(&services["topics"]["command"]).unwrap();
    assert!(
        topics.contains("--replication-factor 3 --config min.insync.replicas=2"),
        "durable topics on three brokers: {topics}"
    );
    assert!(
        topics.contains(
            "--replication-factor 2 --config min.insync.replicas=1 --topic chat.ephemeral"
        ),
        "chat.ephemeral lighter: {topics}"
    );
    for worker in ["connect", "connect-2"] {
        let env = environment(&services[worker]);
        assert_eq!(env["GROUP_ID"], "chatpipe-connect", "{worker}: one group");
        assert_eq!(
            env["BOOTSTRAP_SERVERS"],
            "kafka:19092,kafka-2:19092,kafka-3:19092"
        );
        for key in [
            "CONNECT_CONFIG_STORAGE_REPLICATION_FACTOR",
            "CONNECT_OFFSET_STORAGE_REPLICATION_FACTOR",
            "CONNECT_STATUS_STORAGE_REPLICATION_FACTOR",
        ] {
            assert_eq!(env[key], "3", "{worker}: {key}");
        }
        assert_eq!(
            env["CONNECT_SCHEDULED_REBALANCE_MAX_DELAY_MS"], "15000",
            "{worker}"
        );
    }
    // Our services (built from the Dockerfile) but the migration, which has no Kafka.
    let mut ours = 0;
    for (name, service) in services.as_mapping().unwrap() {
        if service.get("build").is_none() || name.as_str() == Some("migrate") {
            continue;
        }
        assert_eq!(
            environment(service)
                .get("KAFKA_BROKERS")
                .map(String::as_str),
            Some("kafka:19092,kafka-2:19092,kafka-3:19092"),
            "{name:?} is told all three brokers"
        );
        ours += 1;
    }
    assert!(ours >= 6, "{ours} of our services checked");
}

/// The compose files run the versions the native stack runs: every image of ours is
/// tagged with what `scripts/stack.env` pins (checked, since compose cannot read it).
#[test]
fn the_compose_files_images_are_the_versions_scripts_stack_env_pins() {
    use chatpipe_tests::versions::pinned;
    let want: BTreeMap<&str, String> = [
        ("postgres", pinned("PG_MAJOR").to_owned()),
        ("apache/kafka", pinned("KAFKA_VERSION").to_owned()),
        (
            "apicurio/apicurio-registry",
            pinned("APICURIO_VERSION").to_owned(),
        ),
        (
            "quay.io/debezium/connect",
            pinned("DEBEZIUM_VERSION").to_owned(),
        ),
    ]
    .into_iter()
    .collect();
    let mut seen: BTreeMap<&str, usize> = BTreeMap::new();
    for file in ["docker-compose.yml", "docker-compose.cluster.yml"] {
        let doc = load(file);
        for (name, service) in doc["services"].as_mapping().unwrap() {
            let Some(image) = service["image"].as_str() else {
                continue;
            };
            let (repo, tag) = image.rsplit_once(':').unwrap_or((image, "latest"));
            if let Some((pinned_repo, version)) = want.get_key_value(repo) {
                assert_eq!(
                    tag, version,
                    "{file}: service {name:?} runs {image}; scripts/stack.env pins {version}"
                );
                *seen.entry(pinned_repo).or_default() += 1;
            }
        }
    }
    assert_eq!(
        seen.keys().copied().collect::<Vec<_>>(),
        want.keys().copied().collect::<Vec<_>>(),
        "every pinned engine has an image in the compose files"
    );
}
