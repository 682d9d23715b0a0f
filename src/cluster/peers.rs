//! Inter-broker requests: this broker as a Kafka client of another broker
//! (WriteTxnMarkers to a partition's leader, AddPartitionsToTxn verify-only
//! to a transaction coordinator), on each broker's
//! `inter.broker.listener.name` endpoint from the image.
//!
//! One connection per peer broker, one request at a time on it (callers
//! queue on the connection's lock); a connection that fails is dropped and
//! the next call opens a new one.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Buf, BufMut, BytesMut};
use kafka_protocol::messages::{ApiKey, RequestHeader, ResponseHeader};
use kafka_protocol::protocol::{Decodable, Encodable, Request, StrBytes};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::Mutex;

use crate::metadata::image::ClusterImage;

/// Largest response accepted from a peer.
const MAX_RESPONSE: usize = 64 << 20;
/// How long one request may take, connection included.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, Clone, thiserror::Error)]
pub enum PeerError {
    #[error("broker {0} is not registered or has no {1} endpoint")]
    NoEndpoint(i32, String),
    #[error("broker {broker}: {reason}")]
    Io { broker: i32, reason: String },
}

/// One peer's connection (and the address it was opened to), locked per call.
type PeerConnection = Arc<Mutex<Option<(String, TcpStream)>>>;

#[derive(Default)]
pub struct Peers {
    listener: String,
    client_id: String,
    connections: std::sync::Mutex<HashMap<i32, PeerConnection>>,
    next_correlation_id: std::sync::atomic::AtomicI32,
}

impl Peers {
    pub fn new(node_id: i32, listener: &str) -> Peers {
        Peers { listener: listener.to_string(), client_id: format!("strand-broker-{node_id}"), ..Default::default() }
    }

    /// Sends `req` at `version` to broker `broker` and returns its response.
    pub async fn call<R: Request>(
        &self,
        image: &ClusterImage,
        broker: i32,
        req: &R,
        version: i16,
    ) -> Result<R::Response, PeerError> {
        let endpoint = image
            .brokers
            .get(&broker)
            .and_then(|b| b.endpoints.iter().find(|e| e.name == self.listener))
            .map(|e| format!("{}:{}", e.host, e.port))
            .ok_or_else(|| PeerError::NoEndpoint(broker, self.listener.clone()))?;
        let slot = {
            let mut conns = self.connections.lock().unwrap_or_else(|e| e.into_inner());
            conns.entry(broker).or_default().clone()
        };
        let mut conn = slot.lock().await;
        let io = |reason: String| PeerError::Io { broker, reason };
        let result = tokio::time::timeout(CALL_TIMEOUT, async {
            if conn.as_ref().is_none_or(|(addr, _)| *addr != endpoint) {
                let stream = TcpStream::connect(&endpoint).await.map_err(|e| io(format!("connect {endpoint}: {e}")))?;
                let _ = stream.set_nodelay(true);
                *conn = Some((endpoint.clone(), stream));
            }
            let (_, stream) = conn.as_mut().expect("connected above");
            let correlation_id = self.next_correlation_id.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let api_key = ApiKey::try_from(R::KEY).map_err(|_| io(format!("unknown api key {}", R::KEY)))?;
            let header = RequestHeader::default()
                .with_request_api_key(R::KEY)
                .with_request_api_version(version)
                .with_correlation_id(correlation_id)
                .with_client_id(Some(StrBytes::from_string(self.client_id.clone())));
            let mut buf = BytesMut::new();
            buf.put_i32(0);
            header.encode(&mut buf, api_key.request_header_version(version)).map_err(|e| io(format!("{e:#}")))?;
            req.encode(&mut buf, version).map_err(|e| io(format!("{e:#}")))?;
            let size = (buf.len() - 4) as i32;
            buf[0..4].copy_from_slice(&size.to_be_bytes());
            stream.write_all(&buf).await.map_err(|e| io(e.to_string()))?;
            let len = stream.read_i32().await.map_err(|e| io(e.to_string()))?;
            if len < 0 || len as usize > MAX_RESPONSE {
                return Err(io(format!("response of {len} bytes")));
            }
            let mut body = vec![0u8; len as usize];
            stream.read_exact(&mut body).await.map_err(|e| io(e.to_string()))?;
            let mut body = bytes::Bytes::from(body);
            let header = ResponseHeader::decode(&mut body, api_key.response_header_version(version))
                .map_err(|e| io(format!("{e:#}")))?;
            if header.correlation_id != correlation_id {
                return Err(io(format!("correlation id {} for {correlation_id}", header.correlation_id)));
            }
            let response = R::Response::decode(&mut body, version).map_err(|e| io(format!("{e:#}")))?;
            if body.has_remaining() {
                tracing::debug!(broker, "{} bytes after a peer response", body.remaining());
            }
            Ok(response)
        })
        .await
        .unwrap_or_else(|_| Err(io("timed out".into())));
        if result.is_err() {
            *conn = None;
        }
        result
    }
}
