use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use chatpipe_core::UserId;
use clap::{Parser, Subcommand};
use ingest_api::configuration::Settings;
use ingest_api::startup::{self, Application};

#[derive(Parser)]
#[command(name = "ingest-api", about = "chatpipe REST API", version)]
struct Cli {
    /// A TOML file overriding the built-in defaults (config/ingest-api.toml).
    #[arg(long, global = true, env = "INGEST_CONFIG")]
    config: Option<PathBuf>,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the API (the default).
    Serve,
    /// Apply pending migrations and exit.
    Migrate,
    /// Load the configuration (the defaults, --config FILE, the environment) and exit:
    /// 0 with "configuration ok", or 1 naming each unknown key and bad value.
    CheckConfig,
    /// Print a bearer token for local use.
    Token {
        #[arg(long)]
        user: i64,
        /// Lifetime in seconds.
        #[arg(long, default_value_t = 86_400)]
        ttl: u64,
    },
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let settings = Settings::load(cli.config.as_deref());
    let command = cli.command.unwrap_or(Command::Serve);
    let tracing = match (&command, &settings) {
        (Command::Serve, Ok(settings)) => {
            chatpipe_core::telemetry::init_tracing("ingest-api", &settings.telemetry)?
        }
        _ => {
            chatpipe_core::telemetry::init_logging();
            chatpipe_core::telemetry::Tracing::none()
        }
    };
    let settings = settings.context("loading configuration")?;
    match command {
        Command::Serve => {
            chatpipe_core::telemetry::build_info("ingest-api");
            chatpipe_core::telemetry::count_from_zero(&[
                "send_queue_rejections_total",
                "db_pool_acquire_timeouts_total",
            ]);
            let app = Application::build(settings).await?;
            tracing::info!(addr = %app.local_addr(), admin = %app.admin_addr(), "ingest-api listening");
            app.run_until_stopped(chatpipe_core::startup::shutdown_signal())
                .await?;
            tokio::task::spawn_blocking(move || tracing.shutdown()).await?;
        }
        Command::CheckConfig => {
            ingest_api::routes::demo::check(&settings.demo, settings.http.addr)?;
            println!("configuration ok");
        }
        Command::Migrate => {
            let pool = startup::connect(&settings.database).await?;
            startup::migrate(&pool).await?;
            println!("migrations applied");
        }
        Command::Token { user, ttl } => {
            let user = UserId::new(user).context("--user")?;
            let keys = settings.auth.token_keys()?;
            if let Some(max) = keys.max_lifetime_secs() {
                anyhow::ensure!(
                    ttl <= max,
                    "--ttl {ttl} is over auth.max_lifetime_secs ({max}): the token would be refused"
                );
            }
            println!("{}", keys.issue(user, Duration::from_secs(ttl)));
        }
    }
    Ok(())
}
