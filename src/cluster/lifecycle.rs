//! A broker's life with the active controller: it registers (a new
//! incarnation on every start, so the controller moves leadership away from
//! the previous one), heartbeats every `broker.heartbeat.interval.ms` with
//! the metadata offset it has applied (the controller unfences it once that
//! reaches its registration), re-registers if the controller no longer
//! knows its epoch, and on shutdown asks for a controlled shutdown:
//! heartbeats saying so until the controller reports it leads nothing.
//! The first registration says whether the previous run stopped cleanly
//! (so a broker that crashed is not elected from the eligible leader
//! replicas); a later one in the same run is clean, nothing was lost.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use super::ClusterNode;
use crate::controller::core::{ControllerError, Reply, Request};
use crate::metadata::records::Endpoint;

/// Longest a controlled shutdown waits for leadership to move away.
const CONTROLLED_SHUTDOWN_MAX: Duration = Duration::from_secs(10);

pub async fn run(
    node: Arc<ClusterNode>,
    endpoints: Vec<Endpoint>,
    rack: Option<String>,
    previous_clean_shutdown: bool,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut clean_shutdown = previous_clean_shutdown;
    loop {
        if *shutdown.borrow() {
            break;
        }
        let step = async {
            if node.broker_epoch() < 0 {
                let wait = register(&node, &endpoints, &rack, clean_shutdown).await;
                if node.broker_epoch() >= 0 {
                    clean_shutdown = true;
                }
                wait
            } else {
                heartbeat(&node, false).await
            }
        };
        let wait = tokio::select! {
            _ = crate::server::listener::wait_shutdown(&mut shutdown) => break,
            wait = step => wait,
        };
        tokio::select! {
            _ = crate::server::listener::wait_shutdown(&mut shutdown) => break,
            _ = tokio::time::sleep(wait) => {}
        }
    }
    controlled_shutdown(&node).await;
    node.end_controlled_shutdown();
}

/// Registers; returns how long to wait before the next step.
async fn register(node: &ClusterNode, endpoints: &[Endpoint], rack: &Option<String>, clean_shutdown: bool) -> Duration {
    let request = Request::Register {
        broker_id: node.node_id,
        incarnation_id: node.incarnation_id,
        endpoints: endpoints.to_vec(),
        rack: rack.clone(),
        clean_shutdown,
    };
    match node.submit(request).await {
        Ok(Reply::Registered { epoch }) => {
            tracing::info!(node = node.node_id, epoch, "registered with the controller");
            node.set_broker_epoch(epoch);
            // Heartbeat at once: it unfences us.
            Duration::ZERO
        }
        Ok(other) => {
            tracing::warn!(node = node.node_id, reply = ?other, "unexpected registration reply");
            node.heartbeat_interval
        }
        Err(e) => {
            tracing::warn!(node = node.node_id, error = %e, "cannot register with the controller yet");
            Duration::from_millis(200)
        }
    }
}

/// One heartbeat; returns how long to wait before the next.
async fn heartbeat(node: &ClusterNode, want_shutdown: bool) -> Duration {
    let request = Request::Heartbeat {
        broker_id: node.node_id,
        epoch: node.broker_epoch(),
        applied_offset: node.image().offset,
        want_shutdown,
    };
    match node.submit(request).await {
        Ok(Reply::Heartbeat { fenced, .. }) => {
            if fenced {
                // Not caught up yet (or just fenced): try again soon.
                Duration::from_millis(100).min(node.heartbeat_interval)
            } else {
                node.heartbeat_interval
            }
        }
        Ok(Reply::Error(ControllerError::StaleBrokerEpoch(_))) => {
            tracing::warn!(node = node.node_id, "the controller does not know our broker epoch; registering again");
            node.set_broker_epoch(-1);
            Duration::ZERO
        }
        Ok(other) => {
            tracing::warn!(node = node.node_id, reply = ?other, "unexpected heartbeat reply");
            node.heartbeat_interval
        }
        Err(e) => {
            tracing::warn!(node = node.node_id, error = %e, "heartbeat failed");
            Duration::from_millis(200)
        }
    }
}

async fn controlled_shutdown(node: &ClusterNode) {
    if node.broker_epoch() < 0 {
        return;
    }
    let started = std::time::Instant::now();
    while started.elapsed() < CONTROLLED_SHUTDOWN_MAX {
        let request = Request::Heartbeat {
            broker_id: node.node_id,
            epoch: node.broker_epoch(),
            applied_offset: node.image().offset,
            want_shutdown: true,
        };
        let attempt = tokio::time::timeout(Duration::from_secs(2), node.submit(request)).await;
        match attempt {
            Ok(Ok(Reply::Heartbeat { shutdown_done: true, .. })) => {
                tracing::info!(node = node.node_id, "controlled shutdown: leadership moved away");
                return;
            }
            Ok(Ok(Reply::Heartbeat { .. })) => {}
            Ok(Ok(_)) | Ok(Err(_)) | Err(_) => {
                // No controller reachable (perhaps the others are stopping
                // too): nothing to hand over to; stop anyway.
                tracing::warn!(node = node.node_id, "controlled shutdown: no answer from the controller; stopping");
                return;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tracing::warn!(node = node.node_id, "controlled shutdown did not finish in time; stopping");
}
