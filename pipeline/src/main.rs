//! `pipeline`: chatpipe's stream processors, and tools to look at the streams.

use chatpipe_runtime::CancellationToken;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use chatpipe_runtime::{Readiness, Supervisor};
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
    /// Run the archiver: chat.events -> the cold tier (Cassandra), with each
    /// conversation's archived seq in PostgreSQL.
    Archive,
    /// Run the notifications processor: chat.events + members, levels and presence ->
    /// chat.notifications, for members who are offline.
    Notifications,
    /// Run the analytics processor: chat.events -> flat records for SQL engines on
    /// chat.analytics.messages, .reads, .deliveries and .membership.
    Analytics,
    /// Run the auditor: chat.events, PostgreSQL, Connect and the services' /readyz ->
    /// alarms on /metrics and a report on GET /report.
    Audit,
    /// Print a topic's records, decoded, as JSON lines on stdout.
    Tail(pipeline::tail::TailArgs),
    /// Put a dead-letter topic's records back on the topic they came from (once: the
    /// group chatpipe-redrive remembers what went back).
    Redrive(pipeline::redrive::RedriveArgs),
    /// Load the configuration (the defaults, --config FILE, the environment) and exit:
    /// 0 with "configuration ok", or 1 naming each unknown key and bad value.
    CheckConfig,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let settings = Settings::load(cli.config.as_deref());
    // The processors export spans (as the service they are); the one-off commands log.
    let service = match cli.command {
        Command::Receipts => Some("receipts"),
        Command::Fanout => Some("fanout"),
        Command::Archive => Some("archive"),
        Command::Notifications => Some("notifications"),
        Command::Analytics => Some("analytics"),
        Command::Audit => Some("audit"),
        _ => None,
    };
    let tracing = match (service, &settings) {
        (Some(service), Ok(s)) => chatpipe_core::telemetry::init_tracing(service, &s.telemetry)?,
        _ => {
            chatpipe_core::telemetry::init_logging();
            chatpipe_core::telemetry::Tracing::none()
        }
    };
    let settings = settings.context("loading configuration")?;
    let readiness = Readiness::default();
    let stop = CancellationToken::new();
    let mut supervisor = Supervisor::new(stop.clone());
    if matches!(
        cli.command,
        Command::Receipts
            | Command::Fanout
            | Command::Audit
            | Command::Archive
            | Command::Analytics
    ) {
        // A missing or malformed database.url is the operator's to fix: refused here,
        // not retried by a supervised reader.
        chatpipe_core::db::connect_options(&settings.database.url, "pipeline")?;
    }
    let extra_routes = match cli.command {
        Command::Tail(args) => {
            return pipeline::tail::run(&settings, args, &mut std::io::stdout().lock()).await
        }
        Command::Redrive(args) => {
            let n = pipeline::redrive::run(&settings, &args).await?;
            println!("redrove {n} records from {}", args.topic);
            return Ok(());
        }
        Command::CheckConfig => {
            println!("configuration ok");
            return Ok(());
        }
        Command::Receipts => {
            chatpipe_core::telemetry::build_info("receipts");
            pipeline::receipts::spawn(&settings, &mut supervisor, &readiness);
            axum::Router::new()
        }
        Command::Fanout => {
            chatpipe_core::telemetry::build_info("fanout");
            chatpipe_core::telemetry::count_from_zero(&["fanout_membership_version_reloads_total"]);
            pipeline::fanout::spawn(&settings, &mut supervisor, &readiness, Arc::default());
            axum::Router::new()
        }
        Command::Archive => {
            chatpipe_core::telemetry::build_info("archive");
            pipeline::archive::spawn(&settings, &mut supervisor, &readiness)?;
            axum::Router::new()
        }
        Command::Notifications => {
            chatpipe_core::telemetry::build_info("notifications");
            pipeline::notify::spawn(&settings, &mut supervisor, &readiness, Arc::default());
            axum::Router::new()
        }
        Command::Analytics => {
            chatpipe_core::telemetry::build_info("analytics");
            pipeline::analytics::spawn(&settings, &mut supervisor, &readiness);
            axum::Router::new()
        }
        Command::Audit => {
            chatpipe_core::telemetry::build_info("audit");
            chatpipe_core::telemetry::count_from_zero(&["audit_seq_gaps_total"]);
            let audit = pipeline::audit::Audit::new(&settings);
            pipeline::audit::spawn(&settings, &mut supervisor, &readiness, audit.clone())?;
            pipeline::audit::report::router(audit)
        }
    };
    chatpipe_runtime::http::serve_with(&settings.http.metrics_addr, readiness, extra_routes)
        .await
        .context("serving http.metrics_addr")?;
    tokio::spawn(async move {
        chatpipe_core::startup::shutdown_signal().await;
        tracing::info!("stopping: finishing open work, committing, leaving the group");
        stop.cancel();
    });
    // A reader that dies makes the process exit non-zero (its manager restarts it).
    let stopped = supervisor.wait().await;
    tokio::task::spawn_blocking(move || tracing.shutdown()).await?;
    stopped
}
