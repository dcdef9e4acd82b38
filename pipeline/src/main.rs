//! `pipeline`: chatpipe's stream processors, and tools to look at the streams.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use anyhow::Context;
use axum::routing::get;
use clap::{Parser, Subcommand};
use pipeline::settings::Settings;

#[derive(Parser)]
#[command(
    name = "pipeline",
    about = "chatpipe stream processors and tools",
    version
)]
struct Cli {
    /// A TOML file overriding the built-in defaults (config/pipeline.toml).
    #[arg(long, global = true, env = "PIPELINE_CONFIG")]
    config: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the receipts aggregator: chat.read-receipts -> batched watermark flushes.
    Receipts,
    /// Run the fanout processor: chat.events + members + presence -> chat.deliveries.
    Fanout,
    /// Print a topic's records, decoded, as JSON lines on stdout.
    Tail(pipeline::tail::TailArgs),
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    chatpipe_core::telemetry::init_logging();
    let settings = Settings::load(cli.config.as_deref()).context("loading configuration")?;
    match cli.command {
        Command::Tail(args) => {
            pipeline::tail::run(&settings, args, &mut std::io::stdout().lock()).await
        }
        Command::Receipts => {
            run_processor(settings, "flushing the open window", |s, stop| {
                pipeline::receipts::run(s, stop)
            })
            .await
        }
        Command::Fanout => {
            run_processor(settings, "committing what was fanned out", |s, stop| {
                pipeline::fanout::run(s, stop, Arc::default())
            })
            .await
        }
    }
}

/// Serves /metrics, runs a blocking processor loop until SIGTERM or Ctrl-C sets its stop
/// flag, and returns how it ended.
async fn run_processor(
    settings: Settings,
    on_stop: &'static str,
    processor: impl FnOnce(&Settings, Arc<AtomicBool>) -> anyhow::Result<()> + Send + 'static,
) -> anyhow::Result<()> {
    serve_metrics(&settings).await?;
    let stop = Arc::new(AtomicBool::new(false));
    let worker = {
        let stop = stop.clone();
        tokio::task::spawn_blocking(move || processor(&settings, stop))
    };
    tokio::spawn(async move {
        shutdown_signal().await;
        tracing::info!("stopping: {on_stop}, then leaving the group");
        stop.store(true, Ordering::Relaxed);
    });
    worker.await?
}

/// `/metrics` and `/healthz` on `http.metrics_addr`.
async fn serve_metrics(settings: &Settings) -> anyhow::Result<()> {
    let handle = chatpipe_core::telemetry::metrics_handle();
    let app = axum::Router::new()
        .route("/metrics", get(move || std::future::ready(handle.render())))
        .route("/healthz", get(|| std::future::ready("ok")));
    let listener = tokio::net::TcpListener::bind(&settings.http.metrics_addr)
        .await
        .with_context(|| format!("binding http.metrics_addr {}", settings.http.metrics_addr))?;
    tokio::spawn(async move { axum::serve(listener, app).await });
    Ok(())
}

async fn shutdown_signal() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("SIGTERM handler");
    tokio::select! { _ = tokio::signal::ctrl_c() => {}, _ = term.recv() => {} }
}
