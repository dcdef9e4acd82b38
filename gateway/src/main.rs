use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use gateway::{Gateway, Sessions, Settings};

#[derive(Parser)]
#[command(name = "gateway", about = "chatpipe WebSocket gateway", version)]
struct Cli {
    /// A TOML file overriding the built-in defaults (config/gateway.toml).
    #[arg(long, env = "GATEWAY_CONFIG")]
    config: Option<PathBuf>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    chatpipe_core::telemetry::init_logging();
    let settings = Settings::load(cli.config.as_deref()).context("loading configuration")?;
    let keys = settings.auth.token_keys()?;
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let gateway = Gateway {
        keys,
        sessions: Sessions::new(settings.sessions.queue_bound),
        heartbeat: Duration::from_millis(settings.sessions.heartbeat_ms),
        shutdown: stop_rx,
    };
    let listener = tokio::net::TcpListener::bind(settings.http.addr)
        .await
        .with_context(|| format!("binding {}", settings.http.addr))?;
    tracing::info!(addr = %settings.http.addr, "gateway listening");
    axum::serve(listener, gateway.router())
        .with_graceful_shutdown(async move {
            let _ = tokio::signal::ctrl_c().await;
            // Connections close with 1001 "gateway shutting down"; clients reconnect elsewhere.
            let _ = stop_tx.send(true);
        })
        .await?;
    Ok(())
}
