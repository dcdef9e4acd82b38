//! `pipeline`: chatpipe's stream processors, and tools to look at the streams.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use anyhow::Context;
use clap::{Parser, Subcommand};
use pipeline::runtime::{Readiness, Supervisor};
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
    let spawn: fn(&Settings, &mut Supervisor, &Readiness) = match cli.command {
        Command::Tail(args) => {
            return pipeline::tail::run(&settings, args, &mut std::io::stdout().lock()).await
        }
        Command::Receipts => pipeline::receipts::spawn,
        Command::Fanout => |s, sup, r| pipeline::fanout::spawn(s, sup, r, Arc::default()),
    };
    let readiness = Readiness::default();
    pipeline::runtime::http::serve(&settings.http.metrics_addr, readiness.clone())
        .await
        .context("serving http.metrics_addr")?;
    let stop = Arc::new(AtomicBool::new(false));
    let mut supervisor = Supervisor::new(stop.clone());
    spawn(&settings, &mut supervisor, &readiness);
    tokio::spawn(async move {
        shutdown_signal().await;
        tracing::info!("stopping: finishing open work, committing, leaving the group");
        stop.store(true, Ordering::Relaxed);
    });
    // A reader that dies makes the process exit non-zero (its manager restarts it).
    supervisor.wait().await
}

async fn shutdown_signal() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("SIGTERM handler");
    tokio::select! { _ = tokio::signal::ctrl_c() => {}, _ = term.recv() => {} }
}
