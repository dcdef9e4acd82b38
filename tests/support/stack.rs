//! Where the tests find the stack (PostgreSQL, Kafka, the schema registry, Kafka
//! Connect with Debezium). Two providers answer the same question:
//!
//! - [`Native`]: the stack `scripts/stack up` runs natively on this machine, found
//!   through the variables `scripts/stack env` prints (`scripts/test` sets them). What
//!   CI runs.
//! - `Containers` (cargo feature `containers`): the same images as docker-compose.yml,
//!   started through testcontainers on a laptop with Docker. Reused across test binaries
//!   and runs (`docker rm -f` the `chatpipe-test-*` containers to start afresh).
//!
//! `CHATPIPE_STACK=native|containers|auto` picks one; `auto` (the default) takes the
//! containers only when none of the stack's variables is set, the feature is compiled
//! in and a Docker engine answers. The fault tests (`stack_faults`, `drill`) stop and
//! start parts with `scripts/stack` itself: they run on the native stack only.

use std::sync::OnceLock;

/// The stack's services, as the tests reach them.
#[derive(Debug, Clone)]
pub struct Endpoints {
    /// A PostgreSQL server URL; tests create databases of their own on it.
    pub database_url: String,
    /// The same server as the services log in: `chatpipe_service`
    /// (config/postgres/roles.sql). Only its user and password are used.
    pub service_database_url: String,
    pub brokers: String,
    /// The registry's Confluent-compatible API.
    pub registry_url: String,
    /// Kafka Connect's REST API.
    pub connect_url: String,
}

/// A way to have a stack to test against.
pub trait Provider {
    fn name(&self) -> &'static str;
    /// The stack's endpoints, starting it if this provider starts stacks.
    fn endpoints(&self) -> anyhow::Result<Endpoints>;
}

/// The native stack of `scripts/stack`, through its environment variables.
pub struct Native;

impl Provider for Native {
    fn name(&self) -> &'static str {
        "native (scripts/stack)"
    }

    fn endpoints(&self) -> anyhow::Result<Endpoints> {
        let var =
            |name: &str, default: &str| std::env::var(name).unwrap_or_else(|_| default.into());
        Ok(Endpoints {
            database_url: var("DATABASE_URL", crate::DEFAULT_DATABASE_URL),
            service_database_url: var("SERVICE_DATABASE_URL", crate::DEFAULT_SERVICE_DATABASE_URL),
            brokers: var("KAFKA_BROKERS", "127.0.0.1:9092"),
            registry_url: var("SCHEMA_REGISTRY_URL", crate::DEFAULT_REGISTRY_URL),
            connect_url: var("KAFKA_CONNECT_URL", "http://127.0.0.1:8083"),
        })
    }
}

/// The stack of this test process, from the provider `CHATPIPE_STACK` picks.
pub fn endpoints() -> &'static Endpoints {
    static ENDPOINTS: OnceLock<Endpoints> = OnceLock::new();
    ENDPOINTS.get_or_init(|| {
        let provider = provider();
        provider
            .endpoints()
            .unwrap_or_else(|e| panic!("the {} stack: {e:#}", provider.name()))
    })
}

fn provider() -> Box<dyn Provider> {
    let choice = std::env::var("CHATPIPE_STACK").unwrap_or_else(|_| "auto".into());
    match choice.as_str() {
        "native" => Box::new(Native),
        "containers" => containers(),
        "auto" => {
            let configured = ["DATABASE_URL", "KAFKA_BROKERS", "SCHEMA_REGISTRY_URL"]
                .iter()
                .any(|v| std::env::var_os(v).is_some());
            if !configured && cfg!(feature = "containers") && docker_answers() {
                containers()
            } else {
                Box::new(Native)
            }
        }
        other => panic!("CHATPIPE_STACK={other}: native, containers or auto"),
    }
}

#[cfg(feature = "containers")]
fn containers() -> Box<dyn Provider> {
    Box::new(containers::Containers)
}

#[cfg(not(feature = "containers"))]
fn containers() -> Box<dyn Provider> {
    panic!(
        "CHATPIPE_STACK=containers needs the container provider: \
         cargo test -p chatpipe-tests --features containers"
    )
}

/// A Docker engine answers on `DOCKER_HOST` or the default socket.
fn docker_answers() -> bool {
    match std::env::var("DOCKER_HOST") {
        Ok(host) => host
            .strip_prefix("unix://")
            .map(|path| std::os::unix::net::UnixStream::connect(path).is_ok())
            .unwrap_or(true),
        Err(_) => std::os::unix::net::UnixStream::connect("/var/run/docker.sock").is_ok(),
    }
}

#[cfg(feature = "containers")]
mod containers {
    //! The stack as containers: the images of docker-compose.yml at the versions
    //! `scripts/stack.env` pins ([`pinned`]), on a
    //! network of their own, with fixed host ports (Kafka advertises its host port, so it
    //! must be known before it starts): PostgreSQL 15432, Kafka 19092, the registry
    //! 18081, Connect 18083.

    use std::time::Duration;

    use testcontainers::core::{ContainerPort, IntoContainerPort, WaitFor};
    use testcontainers::runners::AsyncRunner;
    use testcontainers::{GenericImage, ImageExt, ReuseDirective};
    use testcontainers_modules::postgres::Postgres;

    use super::{Endpoints, Provider};
    use crate::versions::pinned;

    const NETWORK: &str = "chatpipe-test";
    const PG_PORT: u16 = 15432;
    const KAFKA_PORT: u16 = 19092;
    const REGISTRY_PORT: u16 = 18081;
    const CONNECT_PORT: u16 = 18083;
    const SERVICE_PASSWORD: &str = "chatpipe-service-test-secret";
    const CDC_PASSWORD: &str = "chatpipe-cdc-test-secret";

    /// The least-privilege logins, as scripts/stack makes them.
    async fn make_roles() -> anyhow::Result<()> {
        use sqlx::Connection;
        let url = format!("postgres://postgres:postgres@127.0.0.1:{PG_PORT}/postgres");
        let mut admin = sqlx::PgConnection::connect(&url).await?;
        sqlx::raw_sql(include_str!("../../config/postgres/roles.sql"))
            .execute(&mut admin)
            .await?;
        sqlx::raw_sql(&format!(
            "ALTER ROLE chatpipe_service PASSWORD '{SERVICE_PASSWORD}';
             ALTER ROLE chatpipe_cdc PASSWORD '{CDC_PASSWORD}';"
        ))
        .execute(&mut admin)
        .await?;
        Ok(())
    }

    pub struct Containers;

    impl Provider for Containers {
        fn name(&self) -> &'static str {
            "containers (testcontainers)"
        }

        fn endpoints(&self) -> anyhow::Result<Endpoints> {
            // Started on a runtime of their own: tests run on many runtimes, and the
            // containers outlive each of them (they are reused, never stopped here).
            std::thread::spawn(|| {
                tokio::runtime::Builder::new_multi_thread()
                    .enable_all()
                    .build()?
                    .block_on(start())
            })
            .join()
            .map_err(|_| anyhow::anyhow!("starting the containers panicked"))?
        }
    }

    async fn start() -> anyhow::Result<Endpoints> {
        let postgres = Postgres::default()
            .with_tag(pinned("PG_MAJOR"))
            .with_cmd([
                "postgres",
                "-c",
                "wal_level=logical",
                "-c",
                "max_wal_senders=20",
                "-c",
                "max_replication_slots=20",
                "-c",
                "max_connections=300",
                "-c",
                "shared_preload_libraries=pg_stat_statements",
            ])
            .with_network(NETWORK)
            .with_container_name("chatpipe-test-postgres")
            .with_mapped_port(PG_PORT, 5432.tcp())
            .with_reuse(ReuseDirective::Always)
            .start()
            .await?;

        make_roles().await?;

        let kafka = GenericImage::new("apache/kafka", pinned("KAFKA_VERSION"))
            .with_wait_for(WaitFor::message_on_stdout("Kafka Server started"))
            .with_exposed_port(ContainerPort::Tcp(KAFKA_PORT))
            .with_env_var("KAFKA_NODE_ID", "1")
            .with_env_var("KAFKA_PROCESS_ROLES", "broker,controller")
            .with_env_var("KAFKA_CONTROLLER_QUORUM_VOTERS", "1@localhost:9093")
            .with_env_var(
                "KAFKA_LISTENERS",
                format!("INTERNAL://:29092,EXTERNAL://:{KAFKA_PORT},CONTROLLER://:9093"),
            )
            .with_env_var(
                "KAFKA_ADVERTISED_LISTENERS",
                format!("INTERNAL://chatpipe-test-kafka:29092,EXTERNAL://127.0.0.1:{KAFKA_PORT}"),
            )
            .with_env_var("KAFKA_INTER_BROKER_LISTENER_NAME", "INTERNAL")
            .with_env_var("KAFKA_CONTROLLER_LISTENER_NAMES", "CONTROLLER")
            .with_env_var(
                "KAFKA_LISTENER_SECURITY_PROTOCOL_MAP",
                "INTERNAL:PLAINTEXT,EXTERNAL:PLAINTEXT,CONTROLLER:PLAINTEXT",
            )
            .with_env_var("KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR", "1")
            .with_env_var("KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR", "1")
            .with_env_var("KAFKA_TRANSACTION_STATE_LOG_MIN_ISR", "1")
            .with_env_var(
                "KAFKA_SHARE_COORDINATOR_STATE_TOPIC_REPLICATION_FACTOR",
                "1",
            )
            .with_env_var("KAFKA_SHARE_COORDINATOR_STATE_TOPIC_MIN_ISR", "1")
            .with_env_var("KAFKA_AUTO_CREATE_TOPICS_ENABLE", "false")
            .with_network(NETWORK)
            .with_container_name("chatpipe-test-kafka")
            .with_mapped_port(KAFKA_PORT, KAFKA_PORT.tcp())
            .with_reuse(ReuseDirective::Always)
            .with_startup_timeout(Duration::from_secs(120))
            .start()
            .await?;

        let registry = GenericImage::new("apicurio/apicurio-registry", pinned("APICURIO_VERSION"))
            .with_wait_for(WaitFor::message_on_stdout("Installed features"))
            .with_exposed_port(ContainerPort::Tcp(8081))
            .with_env_var("QUARKUS_HTTP_PORT", "8081")
            .with_env_var("APICURIO_REST_DELETION_ARTIFACT_ENABLED", "true")
            .with_env_var("APICURIO_REST_DELETION_ARTIFACT_VERSION_ENABLED", "true")
            .with_env_var("APICURIO_REST_DELETION_GROUP_ENABLED", "true")
            .with_network(NETWORK)
            .with_container_name("chatpipe-test-registry")
            .with_mapped_port(REGISTRY_PORT, 8081.tcp())
            .with_reuse(ReuseDirective::Always)
            .with_startup_timeout(Duration::from_secs(120))
            .start()
            .await?;

        let connect = GenericImage::new("quay.io/debezium/connect", pinned("DEBEZIUM_VERSION"))
            .with_wait_for(WaitFor::message_on_stdout(
                "Finished starting connectors and tasks",
            ))
            .with_exposed_port(ContainerPort::Tcp(8083))
            .with_env_var("BOOTSTRAP_SERVERS", "chatpipe-test-kafka:29092")
            .with_env_var("GROUP_ID", "chatpipe-test-connect")
            .with_env_var("CONFIG_STORAGE_TOPIC", "_connect-configs")
            .with_env_var("OFFSET_STORAGE_TOPIC", "_connect-offsets")
            .with_env_var("STATUS_STORAGE_TOPIC", "_connect-status")
            .with_env_var("OFFSET_FLUSH_INTERVAL_MS", "1000")
            .with_env_var("CONNECT_CONFIG_PROVIDERS", "env")
            .with_env_var(
                "CONNECT_CONFIG_PROVIDERS_ENV_CLASS",
                "org.apache.kafka.common.config.provider.EnvVarConfigProvider",
            )
            .with_env_var("CONNECT_SCHEDULED_REBALANCE_MAX_DELAY_MS", "5000")
            // The connector file reads these (config/stack/chatpipe-outbox-connector.json).
            .with_env_var("CHATPIPE_PG_HOST", "chatpipe-test-postgres")
            .with_env_var("CHATPIPE_PG_PORT", "5432")
            .with_env_var("CHATPIPE_CDC_USER", "chatpipe_cdc")
            .with_env_var("CHATPIPE_CDC_PASSWORD", CDC_PASSWORD)
            .with_env_var("CHATPIPE_PG_SSLMODE", "disable")
            .with_env_var("CHATPIPE_PG_SSLROOTCERT", "")
            .with_env_var("CHATPIPE_PG_DB", "postgres")
            .with_network(NETWORK)
            .with_container_name("chatpipe-test-connect")
            .with_mapped_port(CONNECT_PORT, 8083.tcp())
            .with_reuse(ReuseDirective::Always)
            .with_startup_timeout(Duration::from_secs(180))
            .start()
            .await?;

        // Reused containers stay up after this process: nothing stops them on drop.
        std::mem::forget((postgres, kafka, registry, connect));
        Ok(Endpoints {
            database_url: format!("postgres://postgres:postgres@127.0.0.1:{PG_PORT}/postgres"),
            service_database_url: format!(
                "postgres://chatpipe_service:{SERVICE_PASSWORD}@127.0.0.1:{PG_PORT}/postgres"
            ),
            brokers: format!("127.0.0.1:{KAFKA_PORT}"),
            registry_url: format!("http://127.0.0.1:{REGISTRY_PORT}/apis/ccompat/v7"),
            connect_url: format!("http://127.0.0.1:{CONNECT_PORT}"),
        })
    }
}

/// The repository's root (where `scripts/stack` lives).
pub fn repo_root() -> std::path::PathBuf {
    std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent")
        .to_owned()
}

/// The pid of a component `scripts/stack` started (`kafka`, `connect`, `kafka-2`, …).
pub fn component_pid(component: &str) -> i32 {
    let home = std::env::var("STACK_HOME")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|_| repo_root().join(".stack"));
    let file = home.join(format!("run/{component}.pid"));
    std::fs::read_to_string(&file)
        .unwrap_or_else(|e| {
            panic!(
                "{}: {e}; is the stack up (scripts/stack up, or up --cluster)?",
                file.display()
            )
        })
        .trim()
        .parse()
        .expect("a pid")
}

/// Sends `sig` (`-STOP`, `-CONT`, `-9`) to `pid`.
pub fn signal(sig: &str, pid: i32) {
    let status = std::process::Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .expect("kill runs");
    assert!(status.success(), "kill {sig} {pid}");
}

/// Runs `scripts/stack ARGS` (start, restart, down a component) and fails the test if it
/// fails; says how long it took.
pub async fn run_stack(args: &[&str]) {
    let started = std::time::Instant::now();
    let status = tokio::process::Command::new(repo_root().join("scripts/stack"))
        .args(args)
        .status()
        .await
        .expect("scripts/stack runs");
    assert!(status.success(), "scripts/stack {args:?} failed");
    eprintln!(
        "scripts/stack {} took {:.1} s",
        args.join(" "),
        started.elapsed().as_secs_f64()
    );
}

/// Starts `component` again if the test panics before it did: a failed fault test must
/// not leave the shared stack broken for the next one.
pub struct StartOnPanic(pub String);

impl StartOnPanic {
    pub fn new(component: impl Into<String>) -> Self {
        Self(component.into())
    }
}

impl Drop for StartOnPanic {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let _ = std::process::Command::new(repo_root().join("scripts/stack"))
                .args(["start", &self.0])
                .status();
        }
    }
}

/// Faults hit the whole shared stack: one test of a binary at a time.
pub async fn one_fault_at_a_time() -> tokio::sync::MutexGuard<'static, ()> {
    static TURN: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    TURN.lock().await
}
