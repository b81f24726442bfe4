//! `computerd` built one store version ahead (the `upgrade-probe` feature): the newer binary of
//! the rolling-upgrade test.

#[tokio::main]
async fn main() -> std::process::ExitCode {
    computerd_node::cli::main().await
}
