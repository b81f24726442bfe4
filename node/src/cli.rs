//! The `computerd` command line: parses it and runs the subcommand (shared by the `computerd`
//! binary and the rolling-upgrade test's `computerd-upgrade-probe`).

use clap::Parser;

use crate::config::Cli;
use crate::config::Command;

/// Parses the command line, sets up logging and runs the subcommand.
pub async fn main() -> std::process::ExitCode {
    computerd_proto::mux::keep_freed_memory();
    let logs = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("COMPUTERD_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,openraft=warn,sled=warn")),
        )
        .with_writer(std::io::stderr);
    // One JSON object per line on request: the event's fields at the top level (`message`,
    // `computer_id`, `error_id`, …) and the spans it ran in (`execution_id`, `session_id`, …).
    match std::env::var("COMPUTERD_LOG_FORMAT").as_deref() {
        Err(_) | Ok("" | "text") => logs.init(),
        Ok("json") => logs.json().flatten_event(true).with_current_span(true).with_span_list(true).init(),
        Ok(other) => {
            eprintln!("computerd: COMPUTERD_LOG_FORMAT is text or json, not {other:?}");
            return std::process::ExitCode::from(2);
        }
    }
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Serve(cfg) => crate::serve(cfg, crate::shutdown_signal()).await,
        Command::Dev(cfg) => crate::dev(cfg, crate::shutdown_signal()).await,
        Command::Backup(cfg) => match crate::backup::run(&cfg).await {
            Ok(w) => {
                let (computers, bots, tokens, blobs) = w.counts;
                println!(
                    "backup of cluster {} at index {} written to {} ({} bytes): {computers} computers, {bots} bots, {tokens} tokens, {blobs} blobs (their bytes are not in the file)",
                    w.cluster_id,
                    w.applied_index,
                    cfg.out.display(),
                    w.bytes
                );
                Ok(())
            }
            Err(e) => Err(e),
        },
        Command::Restore(cfg) => {
            let mut serve = cfg.serve;
            serve.restore_from = Some(cfg.from);
            crate::serve(serve, crate::shutdown_signal()).await
        }
        Command::EdgeCert(cfg) => {
            let validity = std::time::Duration::from_secs(cfg.days.max(1) * 86_400);
            match crate::edge_ca::ensure(&cfg.dir, &cfg.names, validity) {
                Ok(f) => {
                    let what = if f.made { "made" } else { "kept (it still fits)" };
                    println!("edge certificate {what}: {} and {}", f.cert.display(), f.key.display());
                    println!("for HAProxy: {}; clients pin {}", f.bundle.display(), f.ca.display());
                    Ok(())
                }
                Err(e) => Err(crate::NodeError::Config(e)),
            }
        }
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("computerd: {e}");
            tracing::error!(error = %e, "node stopped");
            std::process::ExitCode::from(1)
        }
    }
}
