//! `computerd dev`: one node with a local data dir, for a first try on one machine.

use std::future::Future;
use std::time::Duration;

use tokio::net::TcpListener;

use crate::Listeners;
use crate::NodeError;
use crate::config::DevConfig;
use crate::datadir::DataDir;
use crate::run;

/// Runs one node and prints how to call it once it serves.
pub async fn dev(cfg: DevConfig, shutdown: impl Future<Output = ()> + Send + 'static) -> Result<(), NodeError> {
    let serve = cfg.serve_config();
    let bind = |addr: String| async move {
        TcpListener::bind(&addr).await.map_err(|source| NodeError::Listen { addr, source })
    };
    let listeners = Listeners { http: bind(serve.http.clone()).await?, grpc: bind(serve.grpc.clone()).await? };
    let http = listeners.http.local_addr().map_err(|source| NodeError::Listen { addr: serve.http.clone(), source })?;
    let token_path = DataDir::open(&serve.data, serve.node_id)?.admin_token_path();
    let node = tokio::spawn(run(serve, listeners, shutdown));
    // The node writes the token before it serves HTTP; wait for it or for the node to stop.
    let token = loop {
        if node.is_finished() {
            return node.await.map_err(|e| NodeError::Server(e.to_string()))?;
        }
        if let Ok(t) = tokio::fs::read_to_string(&token_path).await
            && t.ends_with('\n')
        {
            break t.trim().to_string();
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    println!("computerd dev: one node at http://{http} (data: {})", cfg.data.display());
    println!("owner token (also in {}): {token}", token_path.display());
    println!("try:  curl -H 'Authorization: Bearer {token}' http://{http}/v1/members");
    node.await.map_err(|e| NodeError::Server(e.to_string()))?
}
