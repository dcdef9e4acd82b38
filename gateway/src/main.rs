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
    /// Load the configuration (the defaults, --config FILE, the environment) and exit:
    /// 0 with "configuration ok", or 1 naming each unknown key and bad value.
    CheckConfig,
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
        /// Ack every message.new as it arrives, as a client does once it has stored it
        /// (`{"type":"ack",…}`: the senders see the delivered tick).
        #[arg(long)]
        ack: bool,
        /// Send each line of standard input as a frame (e.g.
        /// `{"type":"ack","conversationId":7,"seq":12}`).
        #[arg(long)]
        stdin: bool,
    },
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let settings = Settings::load(cli.config.as_deref());
    let command = cli.command.unwrap_or(Command::Serve);
    let tracing = match (&command, &settings) {
        (Command::Serve, Ok(s)) => chatpipe_core::telemetry::init_tracing("gateway", &s.telemetry)?,
        _ => {
            chatpipe_core::telemetry::init_logging();
            chatpipe_core::telemetry::Tracing::none()
        }
    };
    let settings = settings.context("loading configuration")?;
    match command {
        Command::CheckConfig => {
            println!("configuration ok");
            Ok(())
        }
        Command::Serve => {
            chatpipe_core::telemetry::build_info("gateway");
            chatpipe_core::telemetry::count_from_zero(&[
                "gateway_queue_overflows_total",
                "gateway_write_timeouts_total",
            ]);
            let listener = gateway::listener(&settings)
                .with_context(|| format!("binding {} (http.addr)", settings.http.addr))?;
            let admin = gateway::admin_listener(&settings).await?;
            let served = gateway::run(settings, listener, admin, shutdown_signal()).await;
            tokio::task::spawn_blocking(move || tracing.shutdown()).await?;
            served
        }
        Command::Watch {
            user,
            url,
            count,
            timeout_secs,
            ack,
            stdin,
        } => {
            let keys = settings.auth.token_keys()?;
            let token = keys.issue(user, Duration::from_secs(3600));
            let watch = watch(&url, &token, count, ack, stdin);
            match timeout_secs {
                Some(s) => tokio::time::timeout(Duration::from_secs(s), watch)
                    .await
                    .unwrap_or(Ok(())),
                None => watch.await,
            }
        }
    }
}

async fn watch(
    url: &str,
    token: &str,
    count: Option<usize>,
    ack: bool,
    stdin: bool,
) -> anyhow::Result<()> {
    use futures::SinkExt;
    use tokio::io::AsyncBufReadExt;
    use tokio_tungstenite::tungstenite::Message;
    let ws = gateway::client::connect(url, token)
        .await
        .with_context(|| format!("connecting to {url}"))?;
    eprintln!("connected to {url}");
    let (mut sink, mut frames) = ws.split();
    let mut lines = tokio::io::BufReader::new(tokio::io::stdin()).lines();
    let mut seen = 0;
    loop {
        tokio::select! {
            frame = frames.next() => {
                let Some(frame) = frame else { break };
                match frame? {
                    Message::Text(text) => {
                        println!("{text}");
                        if let Some(ack) = ack.then(|| ack_for(&text)).flatten() {
                            sink.send(Message::Text(ack.into())).await?;
                        }
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
            line = lines.next_line(), if stdin => match line? {
                Some(line) if !line.trim().is_empty() => {
                    sink.send(Message::Text(line.into())).await?;
                }
                Some(_) => {}
                None => break,
            },
        }
    }
    Ok(())
}

/// The ack of a `message.new` frame: `{"type":"ack","conversationId":…,"seq":…}`.
fn ack_for(frame: &str) -> Option<String> {
    let v: serde_json::Value = serde_json::from_str(frame).ok()?;
    (v["type"] == "message.new").then(|| {
        serde_json::json!({"type": "ack", "conversationId": v["conversationId"], "seq": v["seq"]})
            .to_string()
    })
}

async fn shutdown_signal() {
    chatpipe_core::startup::shutdown_signal().await;
    tracing::info!("stopping: draining queues, closing connections with 1001");
}

#[cfg(test)]
mod tests {
    use super::ack_for;

    #[test]
    fn a_message_new_frame_is_acked_and_nothing_else() {
        let ack = ack_for(r#"{"type":"message.new","conversationId":7,"seq":12,"body":"x"}"#);
        let ack: serde_json::Value = serde_json::from_str(&ack.unwrap()).unwrap();
        assert_eq!(
            ack,
            serde_json::json!({"type": "ack", "conversationId": 7, "seq": 12})
        );
        assert_eq!(
            ack_for(r#"{"type":"read.updated","conversationId":7}"#),
            None
        );
        assert_eq!(ack_for("not json"), None);
    }
}
