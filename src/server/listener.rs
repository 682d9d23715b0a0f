//! Accepts connections, bounded by `max.connections`, until shutdown.

use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::sync::{watch, Semaphore};
use tokio::task::JoinSet;

use crate::broker::BrokerState;
use crate::server::connection;

/// Serves one listener until `shutdown` flips to true, then waits for its
/// connections to finish their in-flight requests.
pub async fn serve(
    state: Arc<BrokerState>,
    listener: TcpListener,
    listener_name: String,
    shutdown: watch::Receiver<bool>,
    permits: Arc<Semaphore>,
) {
    let mut connections = JoinSet::new();
    let mut stop = shutdown.clone();
    loop {
        tokio::select! {
            _ = wait_shutdown(&mut stop) => break,
            accepted = listener.accept() => {
                let (socket, peer) = match accepted {
                    Ok(x) => x,
                    Err(e) => {
                        // Usually EMFILE; back off briefly rather than spin.
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let permit = match permits.clone().try_acquire_owned() {
                    Ok(p) => p,
                    Err(_) => {
                        tracing::warn!(%peer, max = state.config().max_connections, "connection refused: max.connections reached");
                        drop(socket);
                        continue;
                    }
                };
                let _ = socket.set_nodelay(true);
                let state = state.clone();
                let name = listener_name.clone();
                let shutdown = shutdown.clone();
                connections.spawn(async move {
                    connection::run(state, socket, peer, name, shutdown).await;
                    drop(permit);
                });
                // Reap finished connection tasks so the set stays small.
                while connections.try_join_next().is_some() {}
            }
        }
    }
    drop(listener);
    while connections.join_next().await.is_some() {}
}

/// Resolves once the shutdown flag is set (or its sender is gone).
pub async fn wait_shutdown(shutdown: &mut watch::Receiver<bool>) {
    // The guard `wait_for` returns is not Send; drop it before resolving.
    let _ = shutdown.wait_for(|s| *s).await.map(|_| ());
}
