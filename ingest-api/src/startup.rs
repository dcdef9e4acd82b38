//! Wiring: the pool, the router, the middleware and the server's life cycle.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use axum::error_handling::HandleErrorLayer;
use axum::extract::{DefaultBodyLimit, MatchedPath, Request};
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use axum::{BoxError, Router};
use chatpipe_core::auth::TokenKeys;
use chatpipe_core::problem::Problem;
use chatpipe_core::telemetry::PrometheusHandle;
use chatpipe_schemas::registry::Registry;
use secrecy::ExposeSecret;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::PgPool;
use tokio::net::TcpListener;
use tower::ServiceBuilder;

use crate::configuration::ReadMode;
use crate::configuration::{DatabaseSettings, Limits, Settings};
use crate::error::ErrorCause;
use crate::receipts::ReceiptProducer;
use crate::routes;
use crate::store::{Outbox, Store};

/// What every handler can reach.
#[derive(Clone)]
pub struct AppState {
    pub store: Store,
    pub keys: TokenKeys,
    pub limits: Arc<Limits>,
    pub max_request_bytes: usize,
    pub metrics: PrometheusHandle,
    /// `Some` when `reads.mode = "stream"`.
    pub receipts: Option<ReceiptProducer>,
}

pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../migrations");

/// A bound listener plus everything needed to serve on it.
pub struct Application {
    listener: TcpListener,
    router: Router,
    pool: PgPool,
    shutdown_grace: Duration,
}

impl Application {
    pub async fn build(settings: Settings) -> anyhow::Result<Self> {
        let keys = settings.auth.token_keys()?;
        let registry = Registry::new(
            &settings.registry.url,
            Duration::from_millis(settings.registry.timeout_ms),
        )
        .context("registry.url (SCHEMA_REGISTRY_URL)")?;
        // Refuses to start on a schema the registry calls incompatible.
        let codec = registry
            .event_codec_for(&settings.registry.events_subject)
            .await
            .context("registering the chat.events schema")?;
        let pool = connect(&settings.database).await?;
        if settings.database.migrate_on_start {
            MIGRATOR.run(&pool).await.context("applying migrations")?;
        }
        let receipts = match settings.reads.mode {
            ReadMode::Direct => None,
            ReadMode::Stream => {
                let codec = registry
                    .receipt_codec()
                    .await
                    .context("registering the chat.read-receipts schema")?;
                Some(
                    ReceiptProducer::new(&settings.kafka, codec)
                        .context("the Kafka producer (kafka.brokers)")?,
                )
            }
        };
        let state = AppState {
            store: Store {
                pool: pool.clone(),
                outbox: Outbox::new(codec, settings.outbox.delete_after_write),
            },
            keys,
            limits: Arc::new(settings.limits.clone()),
            max_request_bytes: settings.http.max_request_bytes,
            metrics: chatpipe_core::telemetry::metrics_handle(),
            receipts,
        };
        let router = router(state, settings.http.request_timeout());
        let listener = TcpListener::bind(settings.http.addr)
            .await
            .with_context(|| format!("binding {}", settings.http.addr))?;
        Ok(Self {
            listener,
            router,
            pool,
            shutdown_grace: Duration::from_millis(settings.http.shutdown_grace_ms),
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.listener
            .local_addr()
            .expect("a bound listener has an address")
    }

    pub fn pool(&self) -> PgPool {
        self.pool.clone()
    }

    /// Serves until `shutdown` resolves, then lets in-flight requests finish for up to
    /// `http.shutdown_grace_ms`.
    pub async fn run_until_stopped(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> std::io::Result<()> {
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        let grace = self.shutdown_grace;
        let signal = async move {
            shutdown.await;
            tracing::info!(
                grace_ms = grace.as_millis() as u64,
                "shutting down; draining in-flight requests"
            );
            let _ = stop_tx.send(true);
        };
        let server = axum::serve(self.listener, self.router).with_graceful_shutdown(signal);
        let mut stopped = stop_rx.clone();
        let deadline = async move {
            let _ = stopped.wait_for(|s| *s).await;
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
    let options: PgConnectOptions = db
        .url
        .expose_secret()
        .parse()
        .context("database.url (DATABASE_URL) is not a PostgreSQL URL")?;
    let options = db.synchronous_commit.apply(
        options
            .application_name("ingest-api")
            .options([("statement_timeout", db.statement_timeout_ms.to_string())]),
    );
    PgPoolOptions::new()
        .max_connections(db.max_connections)
        .min_connections(db.min_connections)
        .acquire_timeout(Duration::from_millis(db.acquire_timeout_ms))
        .connect_with(options)
        .await
        .context("connecting to PostgreSQL (database.url / DATABASE_URL)")
}

pub fn router(state: AppState, request_timeout: Duration) -> Router {
    let max_request_bytes = state.max_request_bytes;
    let api = Router::new()
        .route("/conversations", post(routes::conversations::create))
        .route("/direct", post(routes::conversations::open_direct))
        .route(
            "/conversations/{id}/members",
            post(routes::conversations::add_members),
        )
        .route(
            "/conversations/{id}/members/{userId}",
            delete(routes::conversations::remove_member),
        )
        .route(
            "/conversations/{id}/messages",
            post(routes::messages::send).get(routes::messages::history),
        )
        .route("/conversations/{id}/read", post(routes::reads::mark_read))
        .route(
            "/conversations/{id}/messages/{seq}/receipts",
            get(routes::reads::receipts),
        )
        .route("/inbox", get(routes::inbox::inbox))
        .layer(
            ServiceBuilder::new()
                .layer(HandleErrorLayer::new(timed_out))
                .timeout(request_timeout),
        );
    Router::new()
        .merge(api)
        .route("/healthz", get(routes::health::healthz))
        .route("/readyz", get(routes::health::readyz))
        .route("/metrics", get(routes::health::metrics))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(max_request_bytes))
        .layer(middleware::from_fn(observe))
        .with_state(state)
}

async fn timed_out(err: BoxError) -> Response {
    if err.is::<tower::timeout::error::Elapsed>() {
        metrics::counter!("http_request_timeouts_total").increment(1);
        Problem::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "timeout",
            "Request timed out",
            "the request took longer than http.request_timeout_ms; retry with the same clientMsgId",
        )
        .into_response()
    } else {
        Problem::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            "Internal error",
            err.to_string(),
        )
        .into_response()
    }
}

async fn not_found() -> Response {
    Problem::new(
        StatusCode::NOT_FOUND,
        "not-found",
        "Not found",
        "no such route",
    )
    .into_response()
}

async fn method_not_allowed() -> Response {
    Problem::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method-not-allowed",
        "Method not allowed",
        "this route does not take that method",
    )
    .into_response()
}

/// Counts and times every request by route, and logs each failed one exactly once.
async fn observe(request: Request, next: Next) -> Response {
    let started = Instant::now();
    let method = request.method().clone();
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map(|p| p.as_str().to_owned())
        .unwrap_or_else(|| "unmatched".to_owned());
    let response = next.run(request).await;
    let elapsed = started.elapsed();
    let status = response.status();
    let labels = [
        ("method", method.to_string()),
        ("route", route.clone()),
        ("status", status.as_u16().to_string()),
    ];
    metrics::counter!("http_requests_total", &labels).increment(1);
    metrics::histogram!("http_request_duration_seconds", "method" => method.to_string(), "route" => route.clone())
        .record(elapsed.as_secs_f64());
    if status.is_client_error() || status.is_server_error() {
        let detail = response
            .extensions()
            .get::<Problem>()
            .map(|p| p.detail.clone())
            .unwrap_or_default();
        let cause = response
            .extensions()
            .get::<ErrorCause>()
            .map(|c| c.0.clone())
            .unwrap_or_default();
        let ms = elapsed.as_millis() as u64;
        if status.is_server_error() {
            tracing::error!(%method, %route, status = status.as_u16(), ms, %detail, %cause, "request failed");
        } else {
            tracing::info!(%method, %route, status = status.as_u16(), ms, %detail, "request refused");
        }
    }
    response
}

/// Resolves on Ctrl-C or SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! { () = ctrl_c => {}, () = terminate => {} }
}
