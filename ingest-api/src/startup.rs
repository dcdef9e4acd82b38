//! Wiring: the pool, the state every handler shares (built here), and the server's life
//! cycle. The routes and their middleware are in [`crate::routes::router`].

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use axum::Router;
use chatpipe_core::startup::wait_for;
use chatpipe_schemas::registry::incompatible;
use sqlx::postgres::PgPoolOptions;
use sqlx::PgPool;
use tokio::net::TcpListener;

use crate::configuration::ReadMode;
use crate::configuration::{DatabaseSettings, Settings};
use crate::rate::RateLimits;
use crate::receipts::ReceiptProducer;
use crate::routes;
use crate::state::AppState;
use crate::store::send::SendQueue;
use crate::store::{Outbox, Store};

use crate::store::sync::CursorKey;

pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../migrations");

/// A bound listener plus everything needed to serve on it.
pub struct Application {
    listener: TcpListener,
    router: Router,
    admin_listener: TcpListener,
    admin_router: Router,
    pool: PgPool,
    sends: SendQueue,
    shutdown_grace: Duration,
    connection_limits: chatpipe_core::http::ConnectionLimits,
}

impl Application {
    pub async fn build(settings: Settings) -> anyhow::Result<Self> {
        crate::routes::demo::check(&settings.demo, settings.http.addr)?;
        let keys = settings
            .auth
            .token_keys()?
            .accepting_demo(settings.auth.accept_demo_tokens || settings.demo.enabled);
        keys.start();
        let registry = settings
            .registry
            .connect()
            .context("registry.url (SCHEMA_REGISTRY_URL)")?;
        // Waits for a registry that is not up yet; refuses to start on a schema the
        // registry calls incompatible.
        let patience = settings.registry.startup_wait();
        let codec = wait_for(
            "registering the chat.events schema",
            patience,
            || registry.event_codec_for(&settings.registry.events_subject),
            incompatible,
        )
        .await
        .context("registering the chat.events schema")?;
        let pool = connect(&settings.database).await?;
        if settings.database.migrate_on_start {
            migrate(&pool).await?;
        } else {
            require_schema(&pool).await?;
        }
        let receipts = receipt_producer(&settings, &registry).await?;
        let store = Store {
            pool: pool.clone(),
            outbox: Outbox::new(codec, settings.outbox.retain_until_confirmed),
            members: crate::store::members::Members::new(settings.membership),
            cold: chatpipe_core::cold::ColdTier::new(
                &settings.storage,
                chatpipe_core::cold::Schema::Expect,
            ),
        };
        let sends = SendQueue::new(store.clone(), settings.sends.clone());
        let rate = RateLimits::new(&settings.rate_limits, settings.demo.tokens);
        rate.spawn_sweeper(Duration::from_millis(
            settings.rate_limits.sweep_interval_ms,
        ));
        let state = AppState {
            sends: sends.clone(),
            store,
            keys: Arc::new(keys),
            limits: Arc::new(settings.limits.clone()),
            max_request_bytes: settings.http.max_request_bytes,
            metrics: chatpipe_core::telemetry::metrics_handle(),
            receipts,
            rate,
            cursors: CursorKey::load(&pool)
                .await
                .context("reading the sync cursor key (migration 20261201000008)")?,
            sync_bounds: settings.sync,
            ready: Default::default(),
            demo: settings
                .demo
                .enabled
                .then(|| Arc::new(settings.demo.clone())),
        };
        let admin_router = routes::admin_router(state.clone());
        let mut router = routes::router(state, settings.http.request_timeout());
        if let Some(cors) = routes::cors(&settings.http.cors_allowed_origins)? {
            router = router.layer(cors);
        }
        let listener = TcpListener::bind(settings.http.addr)
            .await
            .with_context(|| format!("binding {} (http.addr)", settings.http.addr))?;
        let admin_listener = TcpListener::bind(settings.admin.addr)
            .await
            .with_context(|| format!("binding {} (admin.addr)", settings.admin.addr))?;
        Ok(Self {
            listener,
            router,
            admin_listener,
            admin_router,
            pool,
            sends,
            shutdown_grace: Duration::from_millis(settings.http.shutdown_grace_ms),
            connection_limits: settings.http.connection_limits(),
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.listener
            .local_addr()
            .expect("a bound listener has an address")
    }

    /// The admin listener's address (`/metrics`, detailed `/readyz`).
    pub fn admin_addr(&self) -> SocketAddr {
        self.admin_listener
            .local_addr()
            .expect("a bound listener has an address")
    }

    pub fn pool(&self) -> PgPool {
        self.pool.clone()
    }

    /// The send path's queue, to see what waits in it.
    pub fn sends(&self) -> SendQueue {
        self.sends.clone()
    }

    /// Serves until `shutdown` resolves, then lets in-flight requests finish for up to
    /// `http.shutdown_grace_ms`.
    pub async fn run_until_stopped(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> std::io::Result<()> {
        let stop = tokio_util::sync::CancellationToken::new();
        let grace = self.shutdown_grace;
        let signal = {
            let stop = stop.clone();
            async move {
                shutdown.await;
                tracing::info!(
                    grace_ms = grace.as_millis() as u64,
                    "shutting down; draining in-flight requests"
                );
                stop.cancel();
            }
        };
        let server =
            chatpipe_core::http::serve(self.listener, self.router, self.connection_limits, signal);
        // The admin listener lives as long as the process; a few connections suffice.
        tokio::spawn(chatpipe_core::http::serve(
            self.admin_listener,
            self.admin_router,
            chatpipe_core::http::ConnectionLimits::ADMIN,
            std::future::pending(),
        ));
        let deadline = async move {
            stop.cancelled().await;
            tokio::time::sleep(grace).await;
        };
        tokio::select! {
            result = server => result,
            () = deadline => {
                tracing::warn!("shutdown grace elapsed with requests still in flight");
                Ok(())
            }
        }?;
        self.pool.close().await;
        Ok(())
    }
}

/// The bounded pool. Every connection caps each statement at `statement_timeout_ms` and
/// commits durably (`synchronous_commit`): a 201 is sent only after that COMMIT.
pub async fn connect(db: &DatabaseSettings) -> anyhow::Result<PgPool> {
    let options = chatpipe_core::db::connect_options(&db.url, "ingest-api")?;
    let options = db
        .synchronous_commit
        .apply(options.options([("statement_timeout", db.statement_timeout_ms.to_string())]));
    PgPoolOptions::new()
        .max_connections(db.max_connections)
        .min_connections(db.min_connections)
        .acquire_timeout(Duration::from_millis(db.acquire_timeout_ms))
        .connect_with(options)
        .await
        .context("connecting to PostgreSQL (database.url / DATABASE_URL)")
}

/// Applies pending migrations, on a connection of their own without the pool's
/// `statement_timeout`: building an index on a table of production size takes longer than
/// a request may, and a fresh database on a busy server can take seconds for its first
/// table. The connection is closed afterwards, not returned to the pool.
pub async fn migrate(pool: &PgPool) -> anyhow::Result<()> {
    // A connection of its own that starts without the timeout (the last `-c` option of
    // the startup packet wins): a `SET` afterwards would itself run under the timeout.
    let options = (*pool.connect_options())
        .clone()
        .options([("statement_timeout", "0")]);
    let mut conn = <sqlx::PgConnection as sqlx::Connection>::connect_with(&options)
        .await
        .context("a connection to apply migrations")?;
    let applied = MIGRATOR.run(&mut conn).await.context("applying migrations");
    let _ = sqlx::Connection::close(conn).await;
    applied
}

/// Refuses a database whose schema is older than this build (or has none): the services
/// do not own the schema and cannot migrate it; `ingest-api migrate`, run as its owner,
/// does. A newer schema is fine (migrations add; a rolling deploy runs old and new).
pub async fn require_schema(pool: &PgPool) -> anyhow::Result<()> {
    let needed = MIGRATOR.iter().map(|m| m.version).max().unwrap_or(0);
    let applied: Option<i64> =
        sqlx::query_scalar("SELECT max(version) FROM _sqlx_migrations WHERE success")
            .fetch_one(pool)
            .await
            .map_err(|err| match &err {
                sqlx::Error::Database(db) if db.code().as_deref() == Some("42P01") => {
                    anyhow::anyhow!(
                        "the database has no chatpipe schema: run `ingest-api migrate` \
                         as the schema's owner first"
                    )
                }
                _ => anyhow::Error::new(err).context("reading the applied migrations"),
            })?;
    match applied {
        Some(version) if version >= needed => Ok(()),
        applied => anyhow::bail!(
            "the database's schema is at migration {}, this build needs {needed}: run \
             `ingest-api migrate` as the schema's owner first",
            applied.map_or("none".to_owned(), |v| v.to_string())
        ),
    }
}

/// In stream mode (`reads.mode`), the producer of read receipts and delivery acks, once
/// both schemas are registered (waited for up to `registry.startup_wait_ms`).
async fn receipt_producer(
    settings: &Settings,
    registry: &chatpipe_schemas::registry::Registry,
) -> anyhow::Result<Option<ReceiptProducer>> {
    if settings.reads.mode == ReadMode::Direct {
        return Ok(None);
    }
    let patience = settings.registry.startup_wait();
    let codec = wait_for(
        "registering the chat.read-receipts schema",
        patience,
        || registry.receipt_codec(),
        incompatible,
    )
    .await
    .context("registering the chat.read-receipts schema")?;
    let acks_subject = format!("{}-value", settings.kafka.acks_topic);
    let acks = wait_for(
        "registering the delivery acks' schema",
        patience,
        || registry.receipt_codec_for(&acks_subject),
        incompatible,
    )
    .await
    .context("registering the delivery acks' schema")?;
    let producer = ReceiptProducer::new(&settings.kafka, codec, acks)
        .context("the Kafka producer (kafka.brokers)")?;
    Ok(Some(producer))
}
