//! `pipeline`: chatpipe's stream processors, and tools to look at the streams.

use std::path::PathBuf;

use anyhow::Context;
use clap::{Parser, Subcommand};

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
    /// Print a topic's records, decoded, as JSON lines on stdout.
    Tail(pipeline::tail::TailArgs),
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    chatpipe_core::telemetry::init_logging();
    let settings = pipeline::settings::Settings::load(cli.config.as_deref())
        .context("loading configuration")?;
    match cli.command {
        Command::Tail(args) => {
            pipeline::tail::run(&settings, args, &mut std::io::stdout().lock()).await
        }
    }
}
