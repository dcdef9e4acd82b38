use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, Subcommand};
use futures::StreamExt;
use gateway::Settings;

#[derive(Parser)]
#[command(name = "gateway", about = "chatpipe WebSocket gateway", version)]
struct Cli {
    /// A TOML file overriding the built-in defaults (config/gateway.toml).
    #[arg(long, global = true, env = "GATEWAY_CONFIG")]
    config: Option<PathBuf>,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Serve /ws (the default).
    Serve,
    /// Connect to a gateway as a user and print each frame it pushes, one JSON per line.
    Watch {
        /// The user to connect as (a token is minted with JWT_SECRET).
        #[arg(long)]
        user: chatpipe_core::UserId,
        #[arg(long, default_value = "ws://127.0.0.1:8090/ws")]
        url: String,
        /// Stop after this many frames.
        #[arg(long)]
        count: Option<usize>,
        /// Stop after this many seconds.
        #[arg(long)]
        timeout_secs: Option<u64>,
    },
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    chatpipe_core::telemetry::init_logging();
    let settings = Settings::load(cli.config.as_deref()).context("loading configuration")?;
    match cli.command.unwrap_or(Command::Serve) {
        Command::Serve => {
            let listener = gateway::listener(&settings)
                .with_context(|| format!("binding {} (http.addr)", settings.http.addr))?;
            let admin = gateway::admin_listener(&settings).await?;
            gateway::run(settings, listener, admin, shutdown_signal()).await
        }
        Command::Watch {
            user,
            url,
            count,
            timeout_secs,
        } => {
            let keys = settings.auth.token_keys()?;
            let token = keys.issue(user, Duration::from_secs(3600));
            let watch = watch(&url, &token, count);
            match timeout_secs {
                Some(s) => tokio::time::timeout(Duration::from_secs(s), watch)
                    .await
                    .unwrap_or(Ok(())),
                None => watch.await,
            }
        }
    }
}

async fn watch(url: &str, token: &str, count: Option<usize>) -> anyhow::Result<()> {
    use tokio_tungstenite::tungstenite::Message;
    let mut ws = gateway::client::connect(url, token)
        .await
        .with_context(|| format!("connecting to {url}"))?;
    eprintln!("connected to {url}");
    let mut seen = 0;
    while let Some(frame) = ws.next().await {
        match frame? {
            Message::Text(text) => {
                println!("{text}");
                seen += 1;
                if count.is_some_and(|c| seen >= c) {
                    break;
                }
            }
            Message::Close(reason) => {
                eprintln!("closed: {reason:?}");
                break;
            }
            _ => {}
        }
    }
    Ok(())
}

async fn shutdown_signal() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("SIGTERM handler");
    tokio::select! { _ = tokio::signal::ctrl_c() => {}, _ = term.recv() => {} }
    tracing::info!("stopping: draining queues, closing connections with 1001");
}
