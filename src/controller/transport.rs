//! Controller-to-controller connections: length-prefixed frames over the
//! CONTROLLER listener, opened by a handshake that refuses strangers.
//!
//! Frame: a 4-byte big-endian length, then that many bytes (at most
//! [`MAX_FRAME`]). The first frame each way is a [`Hello`] (JSON); after it,
//! frames carry raft messages (protobuf, as raft-rs encodes them) on a
//! [`Purpose::Raft`] connection, or controller requests and their replies
//! (JSON, one reply per request, in order) on a [`Purpose::Requests`] one.
//!
//! A peer is refused, with the reason sent back and logged on both sides,
//! when it speaks raft but its node id is not one of our voters (a
//! broker-only node may only send requests and fetch the log), when its
//! voters list differs
//! from ours (two nodes configured differently must not form a quorum), or
//! when both know a cluster id and the ids differ.

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::config::Voter;

/// Largest frame: a metadata snapshot must fit.
pub const MAX_FRAME: usize = 256 << 20;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hello {
    pub node_id: i32,
    /// `controller.quorum.voters` in canonical form ([`canonical_voters`]).
    pub voters: String,
    pub cluster_id: Option<String>,
    /// What the connection carries after the handshake.
    #[serde(default)]
    pub purpose: Purpose,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum Purpose {
    /// Raft messages from a peer's sender to our raft node.
    #[default]
    Raft,
    /// A broker's requests for the active controller (registration,
    /// heartbeats, forwarded admin requests), answered in order.
    Requests,
    /// A broker-only node following the metadata log (see [`super::feed`]).
    Metadata,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum HelloReply {
    Welcome { node_id: i32, cluster_id: Option<String> },
    Refused { reason: String },
}

#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    #[error("connection: {0}")]
    Io(#[from] std::io::Error),
    #[error("frame of {0} bytes exceeds the {MAX_FRAME}-byte limit")]
    FrameTooLarge(usize),
    #[error("peer sent a malformed handshake: {0}")]
    BadHello(String),
    #[error("refused: {0}")]
    Refused(String),
}

/// Voters sorted by id, `id@host:port` joined by commas.
pub fn canonical_voters(voters: &[Voter]) -> String {
    let mut v: Vec<&Voter> = voters.iter().collect();
    v.sort_by_key(|v| v.id);
    v.iter().map(|v| format!("{}@{}:{}", v.id, v.host, v.port)).collect::<Vec<_>>().join(",")
}

pub async fn write_frame<W: AsyncWrite + Unpin>(w: &mut W, body: &[u8]) -> Result<(), TransportError> {
    if body.len() > MAX_FRAME {
        return Err(TransportError::FrameTooLarge(body.len()));
    }
    w.write_all(&(body.len() as u32).to_be_bytes()).await?;
    w.write_all(body).await?;
    w.flush().await?;
    Ok(())
}

pub async fn read_frame<R: AsyncRead + Unpin>(r: &mut R) -> Result<Vec<u8>, TransportError> {
    let mut len = [0u8; 4];
    r.read_exact(&mut len).await?;
    let len = u32::from_be_bytes(len) as usize;
    if len > MAX_FRAME {
        return Err(TransportError::FrameTooLarge(len));
    }
    let mut body = vec![0; len];
    r.read_exact(&mut body).await?;
    Ok(body)
}

/// Why we refuse a peer's hello, if we do.
pub fn check_hello(ours: &Hello, voters: &[Voter], theirs: &Hello) -> Result<(), String> {
    // Only voters speak raft; brokers that are not voters (broker-only
    // nodes) may send requests and follow the log.
    if theirs.purpose == Purpose::Raft && !voters.iter().any(|v| v.id == theirs.node_id) {
        return Err(format!(
            "node {} is not one of the voters in controller.quorum.voters ({})",
            theirs.node_id, ours.voters
        ));
    }
    if theirs.node_id == ours.node_id {
        return Err(format!(
            "node {} connected to itself: two nodes are configured with node.id={}",
            ours.node_id, ours.node_id
        ));
    }
    if theirs.voters != ours.voters {
        return Err(format!(
            "controller.quorum.voters differs: node {} has {:?}, node {} has {:?}",
            theirs.node_id, theirs.voters, ours.node_id, ours.voters
        ));
    }
    if let (Some(a), Some(b)) = (&ours.cluster_id, &theirs.cluster_id) {
        if a != b {
            return Err(format!(
                "cluster id differs: node {} belongs to cluster {b}, node {} to cluster {a}",
                theirs.node_id, ours.node_id
            ));
        }
    }
    Ok(())
}

/// The connecting side: send our hello, read the verdict.
pub async fn connect_handshake<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    ours: &Hello,
) -> Result<HelloReply, TransportError> {
    write_frame(stream, &serde_json::to_vec(ours).expect("hello serialises")).await?;
    let reply: HelloReply =
        serde_json::from_slice(&read_frame(stream).await?).map_err(|e| TransportError::BadHello(e.to_string()))?;
    match reply {
        HelloReply::Refused { reason } => Err(TransportError::Refused(reason)),
        welcome => Ok(welcome),
    }
}

/// The accepting side: read the peer's hello, check it, answer. Returns the
/// peer's hello when welcomed.
pub async fn accept_handshake<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    ours: &Hello,
    voters: &[Voter],
) -> Result<Hello, TransportError> {
    let theirs: Hello =
        serde_json::from_slice(&read_frame(stream).await?).map_err(|e| TransportError::BadHello(e.to_string()))?;
    match check_hello(ours, voters, &theirs) {
        Ok(()) => {
            let welcome = HelloReply::Welcome { node_id: ours.node_id, cluster_id: ours.cluster_id.clone() };
            write_frame(stream, &serde_json::to_vec(&welcome).expect("reply serialises")).await?;
            Ok(theirs)
        }
        Err(reason) => {
            let refused = HelloReply::Refused { reason: reason.clone() };
            let _ = write_frame(stream, &serde_json::to_vec(&refused).expect("reply serialises")).await;
            Err(TransportError::Refused(reason))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn voters(ids: &[i32]) -> Vec<Voter> {
        ids.iter().map(|i| Voter { id: *i, host: "127.0.0.1".into(), port: 9000 + *i as u16 }).collect()
    }

    fn hello(node_id: i32, v: &[Voter], cluster: Option<&str>) -> Hello {
        Hello { node_id, voters: canonical_voters(v), cluster_id: cluster.map(String::from), purpose: Purpose::Raft }
    }

    async fn shake(ours: Hello, v: Vec<Voter>, theirs: Hello) -> (Result<HelloReply, String>, Result<Hello, String>) {
        let (mut a, mut b) = tokio::io::duplex(1 << 16);
        let client = async move { connect_handshake(&mut a, &theirs).await.map_err(|e| e.to_string()) };
        let server = async move { accept_handshake(&mut b, &ours, &v).await.map_err(|e| e.to_string()) };
        tokio::join!(client, server)
    }

    #[tokio::test]
    async fn voters_are_welcomed_and_strangers_refused_with_reasons_on_both_sides() {
        let v = voters(&[1, 2, 3]);
        let (c, s) = shake(hello(1, &v, Some("c1")), v.clone(), hello(2, &v, None)).await;
        assert!(matches!(c, Ok(HelloReply::Welcome { node_id: 1, .. })), "{c:?}");
        assert_eq!(s.unwrap().node_id, 2);

        let (c, s) = shake(hello(1, &v, None), v.clone(), hello(9, &v, None)).await;
        assert!(c.unwrap_err().contains("node 9 is not one of the voters"));
        assert!(s.is_err());

        // A broker-only node may fetch the log and send requests.
        for purpose in [Purpose::Metadata, Purpose::Requests] {
            let (c, s) = shake(hello(1, &v, None), v.clone(), Hello { purpose, ..hello(9, &v, None) }).await;
            assert!(c.is_ok() && s.is_ok(), "{c:?} {s:?}");
        }

        let other = voters(&[1, 2, 4]);
        let (c, _) = shake(hello(1, &v, None), v.clone(), hello(2, &other, None)).await;
        assert!(c.unwrap_err().contains("controller.quorum.voters differs"));

        let (c, _) = shake(hello(1, &v, Some("aaa")), v.clone(), hello(2, &v, Some("bbb"))).await;
        let e = c.unwrap_err();
        assert!(e.contains("aaa") && e.contains("bbb"), "{e}");

        let (c, _) = shake(hello(1, &v, None), v.clone(), hello(1, &v, None)).await;
        assert!(c.unwrap_err().contains("two nodes are configured with node.id=1"));
    }

    #[tokio::test]
    async fn oversized_and_garbage_frames_are_errors_not_panics() {
        let (mut a, mut b) = tokio::io::duplex(1 << 16);
        a.write_all(&(u32::MAX).to_be_bytes()).await.unwrap();
        assert!(matches!(read_frame(&mut b).await, Err(TransportError::FrameTooLarge(_))));
        let (mut a, mut b) = tokio::io::duplex(1 << 16);
        write_frame(&mut a, b"not json").await.unwrap();
        let v = voters(&[1]);
        let r = accept_handshake(&mut b, &hello(1, &v, None), &v).await;
        assert!(matches!(r, Err(TransportError::BadHello(_))), "{r:?}");
    }
}
