//! `strand [--config FILE | FILE] [--override key=value ...]`

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use strand::{Broker, BrokerConfig};

#[derive(Parser, Debug)]
#[command(name = "strand", version, about = "A Kafka-compatible log broker")]
struct Args {
    /// Kafka-style server.properties.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// The config file given positionally, as Kafka's start script takes it.
    #[arg(value_name = "FILE", conflicts_with = "config")]
    config_positional: Option<PathBuf>,
    /// Overrides a config key, like kafka-server-start.sh --override.
    #[arg(long = "override", value_name = "KEY=VALUE")]
    overrides: Vec<String>,
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    let path = args.config.or(args.config_positional).unwrap_or_else(|| PathBuf::from("config/server.properties"));
    let config = match BrokerConfig::load(&path, &args.overrides) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("strand: {e}");
            return ExitCode::from(2);
        }
    };
    let mut runtime = tokio::runtime::Builder::new_multi_thread();
    if config.num_io_threads > 0 {
        runtime.worker_threads(config.num_io_threads);
    }
    let runtime = match runtime.enable_all().build() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("strand: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(async move {
        let broker = match Broker::start(config).await {
            Ok(b) => b,
            Err(e) => {
                eprintln!("strand: {e}");
                return ExitCode::FAILURE;
            }
        };
        wait_for_signal().await;
        tracing::info!("shutting down");
        broker.shutdown().await;
        ExitCode::SUCCESS
    })
}

async fn wait_for_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}
