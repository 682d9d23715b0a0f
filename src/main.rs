//! `strand [--config FILE | FILE] [--override key=value ...]`
//! `strand --repair-log PARTITION_DIR [--truncate]`
//! `strand verify --history FILE [--txn-timeout-ms MS] [--transform IN:OUT]`

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
    /// Instead of starting the broker: re-read every segment of one
    /// partition directory (the broker stopped) and report the first
    /// damaged batch. Start-up refuses damage that is not a torn tail.
    #[arg(long, value_name = "PARTITION_DIR")]
    repair_log: Option<PathBuf>,
    /// With --repair-log: cut the log at the damage, deleting every later
    /// segment (the records there are lost), so the broker starts again.
    #[arg(long, requires = "repair_log")]
    truncate: bool,
}

/// `strand verify`: the anomaly checker on a recorded history.
#[derive(Parser, Debug)]
#[command(name = "strand verify", about = "Check a history of client operations for Jepsen's Kafka anomalies")]
struct VerifyArgs {
    /// The history: JSON lines, one operation each (what tests/faults.rs
    /// keeps under target/tmp/faults/).
    #[arg(long, value_name = "FILE")]
    history: PathBuf,
    /// The producers' transaction.timeout.ms: a last stable offset held
    /// below the high watermark longer than this (plus --lso-slack-ms) is stuck.
    #[arg(long, value_name = "MS")]
    txn_timeout_ms: Option<u64>,
    #[arg(long, value_name = "MS", default_value_t = 10_000)]
    lso_slack_ms: u64,
    /// Consume-transform-produce: every acknowledged value of topic IN must
    /// be in the committed output OUT exactly once.
    #[arg(long, value_name = "IN:OUT")]
    transform: Option<String>,
}

/// Exit 0 when the history is clean, 1 with anomalies, 2 when it cannot be read.
fn verify(args: VerifyArgs) -> ExitCode {
    let history = match std::fs::File::open(&args.history)
        .map_err(|e| e.to_string())
        .and_then(|f| strand::verify::History::read(std::io::BufReader::new(f)))
    {
        Ok(h) => h,
        Err(e) => {
            eprintln!("strand verify: {}: {e}", args.history.display());
            return ExitCode::from(2);
        }
    };
    let transform = match args.transform.as_deref().map(|t| t.split_once(':')) {
        None => None,
        Some(Some((input, output))) if !input.is_empty() && !output.is_empty() => {
            Some((input.to_string(), output.to_string()))
        }
        Some(_) => {
            eprintln!("strand verify: --transform wants IN:OUT, two topic names");
            return ExitCode::from(2);
        }
    };
    let options = strand::verify::CheckOptions {
        txn_timeout_ms: args.txn_timeout_ms,
        lso_slack_ms: args.lso_slack_ms,
        transform,
    };
    let report = strand::verify::check(&history, &options);
    print!("{}", report.table());
    if report.is_clean() {
        println!("no anomalies");
        ExitCode::SUCCESS
    } else {
        println!("{} anomalies", report.findings.len());
        ExitCode::from(1)
    }
}

fn main() -> ExitCode {
    // A subcommand of its own: the broker's arguments take a positional file.
    if std::env::args_os().nth(1).is_some_and(|a| a == "verify") {
        return verify(VerifyArgs::parse_from(std::env::args_os().skip(1)));
    }
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
    if let Some(dir) = args.repair_log {
        return repair_log(&dir, args.truncate, config.log);
    }
    // Sockets handed over by the parent (systemd socket activation), taken
    // while this process still has one thread.
    let mut listeners = config.listeners.clone();
    listeners.extend(config.quorum.as_ref().and_then(|q| q.controller_listener.clone()));
    let inherited = match strand::listen_fds::take(&listeners) {
        Ok(sockets) => sockets,
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
        let mut prebound = Vec::new();
        for (name, socket) in inherited {
            match tokio::net::TcpListener::from_std(socket) {
                Ok(socket) => prebound.push((name, socket)),
                Err(e) => {
                    eprintln!("strand: inherited socket {name}: {e}");
                    return ExitCode::FAILURE;
                }
            }
        }
        if config.quorum.as_ref().is_some_and(|q| q.is_controller_only()) {
            return run_controller(config, prebound).await;
        }
        let broker = match Broker::start_with_listeners(config, prebound).await {
            Ok(b) => b,
            Err(e) => {
                eprintln!("strand: {e}");
                return ExitCode::FAILURE;
            }
        };
        let failure = tokio::select! {
            _ = wait_for_signal() => None,
            reason = broker.failed() => Some(reason),
        };
        tracing::info!("shutting down");
        broker.shutdown().await;
        match failure {
            None => ExitCode::SUCCESS,
            Some(reason) => {
                eprintln!("strand: {reason}");
                ExitCode::FAILURE
            }
        }
    })
}

/// A controller-only node (`process.roles=controller`) until a signal.
async fn run_controller(
    config: strand::BrokerConfig,
    mut prebound: Vec<(String, tokio::net::TcpListener)>,
) -> ExitCode {
    let controller = config.quorum.as_ref().and_then(|q| q.controller_listener.as_ref()).map(|l| l.name.clone());
    let socket = prebound.iter().position(|(name, _)| Some(name) == controller.as_ref());
    let socket = socket.map(|i| prebound.swap_remove(i).1);
    if let Some((name, _)) = prebound.first() {
        eprintln!("strand: inherited socket {name}: a controller-only node serves only its CONTROLLER listener");
        return ExitCode::from(2);
    }
    let node = match strand::ControllerNode::start_with_listener(config, socket).await {
        Ok(n) => n,
        Err(e) => {
            eprintln!("strand: {e}");
            return ExitCode::FAILURE;
        }
    };
    let failure = tokio::select! {
        _ = wait_for_signal() => None,
        reason = node.failed() => Some(reason),
    };
    tracing::info!("shutting down");
    node.shutdown().await;
    match failure {
        None => ExitCode::SUCCESS,
        Some(reason) => {
            eprintln!("strand: {reason}");
            ExitCode::FAILURE
        }
    }
}

/// `--repair-log`: report (and with `truncate`, cut at) a partition's first damaged batch.
fn repair_log(dir: &std::path::Path, truncate: bool, log_config: strand_storage::LogConfig) -> ExitCode {
    if !dir.join("checkpoint").exists() {
        eprintln!("strand: {} is not a partition directory (no checkpoint file)", dir.display());
        return ExitCode::from(2);
    }
    let damage = match strand_storage::find_damage(dir) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("strand: {e}");
            return ExitCode::FAILURE;
        }
    };
    let Some(cut) = damage else {
        println!("{}: no damaged batch", dir.display());
        return ExitCode::SUCCESS;
    };
    println!(
        "{}: damaged batch in {} at byte {}: {}\ncutting there keeps offsets below {} and deletes {} later segment(s)",
        dir.display(),
        cut.file.display(),
        cut.position,
        cut.reason,
        cut.offset,
        cut.segments_deleted
    );
    if !truncate {
        println!("nothing changed; run again with --truncate to cut the log");
        return ExitCode::from(1);
    }
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64);
    match strand_storage::Log::repair(dir, log_config, now).and_then(|(log, _)| {
        let end = log.log_end_offset();
        log.close().map(|()| end)
    }) {
        Ok(end) => {
            println!("truncated: the log now ends at offset {end}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("strand: repair failed: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn wait_for_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}
