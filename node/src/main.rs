//! `computerd`: parses the command line and runs a node.

#[tokio::main]
async fn main() -> std::process::ExitCode {
    computerd_node::cli::main().await
}
