//! One task per connection: read frames, handle them one at a time in arrival
//! order (which is how responses stay in request order, as Kafka requires),
//! and hand responses to a writer task so reading the next request overlaps
//! writing the last response.

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::BytesMut;
use tokio::io::{AsyncWriteExt, BufWriter};
use tokio::net::tcp::OwnedWriteHalf;
use tokio::net::TcpStream;
use tokio::sync::{mpsc, watch};

use crate::api::{self, Outcome};
use crate::broker::BrokerState;
use crate::server::frame::read_frame;

/// Responses queued for the writer before the reader stops taking requests:
/// the bound on in-flight work per connection.
const RESPONSES_QUEUED_MAX: usize = 32;

pub async fn run(
    state: Arc<BrokerState>,
    socket: TcpStream,
    peer: SocketAddr,
    listener: String,
    mut shutdown: watch::Receiver<bool>,
) {
    let (mut reader, writer) = socket.into_split();
    let (tx, rx) = mpsc::channel::<BytesMut>(RESPONSES_QUEUED_MAX);
    let writer_task = tokio::spawn(write_loop(writer, rx, peer));
    let max = state.config().socket_request_max_bytes;
    let mut buf = BytesMut::new();
    tracing::debug!(%peer, "connection opened");
    loop {
        let frame = tokio::select! {
            biased;
            _ = crate::server::listener::wait_shutdown(&mut shutdown) => break,
            frame = read_frame(&mut reader, max, &mut buf) => frame,
        };
        let frame = match frame {
            Ok(Some(f)) => f,
            Ok(None) => break,
            Err(e) => {
                tracing::warn!(%peer, error = %e, "closing connection: bad frame");
                break;
            }
        };
        match api::handle(&state, &listener, peer, frame, &shutdown).await {
            Outcome::Respond(bytes) => {
                if tx.send(bytes).await.is_err() {
                    break;
                }
            }
            Outcome::NoResponse => {}
            Outcome::Close(reason) => {
                tracing::warn!(%peer, %reason, "closing connection");
                break;
            }
        }
    }
    // Responses already produced are still delivered before the socket closes.
    drop(tx);
    let _ = writer_task.await;
    tracing::debug!(%peer, "connection closed");
}

/// Writes responses in order, coalescing whatever is queued into one flush.
async fn write_loop(writer: OwnedWriteHalf, mut rx: mpsc::Receiver<BytesMut>, peer: SocketAddr) {
    let mut writer = BufWriter::with_capacity(64 * 1024, writer);
    while let Some(first) = rx.recv().await {
        let mut next = Some(first);
        while let Some(bytes) = next {
            if let Err(e) = writer.write_all(&bytes).await {
                tracing::debug!(%peer, error = %e, "write failed");
                return;
            }
            next = rx.try_recv().ok();
        }
        if let Err(e) = writer.flush().await {
            tracing::debug!(%peer, error = %e, "flush failed");
            return;
        }
    }
    let _ = writer.shutdown().await;
}
