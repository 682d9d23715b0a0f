//! Requests for the active controller from a node that may not be it: the
//! connection over the CONTROLLER listener ([`ControllerClient`]) and the
//! retry loop that finds the leader ([`submit`]), shared by voters and
//! broker-only nodes.

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use tokio::net::TcpStream;
use tokio::sync::watch;

use super::core::{Reply, Request};
use super::driver::{DriverError, QuorumView};
use super::transport::{self, Hello, Purpose};
use crate::config::Voter;
use crate::metadata::image::ClusterImage;

/// A reply and the metadata offset it was answered at (the offset of the
/// request's committed batch, or later).
pub type Answer = Result<(Reply, u64), DriverError>;

/// One cached connection to the controller last asked.
pub struct ControllerClient {
    node_id: i32,
    voters: Vec<Voter>,
    voters_text: String,
    image: watch::Receiver<Arc<ClusterImage>>,
    connection: tokio::sync::Mutex<Option<(i32, TcpStream)>>,
}

impl ControllerClient {
    pub fn new(
        node_id: i32,
        voters: Vec<Voter>,
        voters_text: String,
        image: watch::Receiver<Arc<ClusterImage>>,
    ) -> ControllerClient {
        ControllerClient { node_id, voters, voters_text, image, connection: tokio::sync::Mutex::new(None) }
    }

    /// One request to the controller on `leader`, over the cached connection
    /// (reopened if it went to someone else or broke).
    pub async fn forward(&self, leader: i32, request: &Request) -> Answer {
        let Some(voter) = self.voters.iter().find(|v| v.id == leader) else {
            return Err(DriverError::Unreachable(format!("leader {leader} is not in controller.quorum.voters")));
        };
        let mut cached = self.connection.lock().await;
        let body = serde_json::to_vec(request).expect("requests serialise");
        for attempt in 0..2 {
            if cached.as_ref().is_none_or(|(id, _)| *id != leader) {
                *cached = None;
                let addr = format!("{}:{}", voter.host, voter.port);
                let connect = tokio::time::timeout(Duration::from_secs(2), TcpStream::connect(&addr)).await;
                let mut stream = match connect {
                    Ok(Ok(s)) => s,
                    Ok(Err(e)) => return Err(DriverError::Unreachable(format!("controller {leader} at {addr}: {e}"))),
                    Err(_) => {
                        return Err(DriverError::Unreachable(format!("controller {leader} at {addr}: timed out")))
                    }
                };
                let _ = stream.set_nodelay(true);
                let hello = Hello {
                    node_id: self.node_id,
                    voters: self.voters_text.clone(),
                    cluster_id: self.image.borrow().cluster_id.clone(),
                    purpose: Purpose::Requests,
                };
                if let Err(e) = transport::connect_handshake(&mut stream, &hello).await {
                    return Err(DriverError::Unreachable(format!("controller {leader} at {addr}: {e}")));
                }
                *cached = Some((leader, stream));
            }
            let (_, stream) = cached.as_mut().expect("connected above");
            let exchanged = async {
                transport::write_frame(stream, &body).await?;
                transport::read_frame(stream).await
            };
            match exchanged.await {
                Ok(frame) => {
                    return serde_json::from_slice::<Answer>(&frame).unwrap_or_else(|e| {
                        Err(DriverError::Unreachable(format!("controller {leader} answered: {e}")))
                    });
                }
                // A cached connection may have been closed by the peer: one fresh try.
                Err(e) => {
                    *cached = None;
                    if attempt == 1 {
                        return Err(DriverError::Unreachable(format!("controller {leader}: {e}")));
                    }
                }
            }
        }
        unreachable!("the loop returns on its second attempt")
    }
}

/// Asks the active controller through `ask(leader)` until it answers or
/// `timeout` passes: the leader this node knows, else the one a refusal
/// named, else each voter in turn. Returns once `image` has applied the
/// reply's offset, so what follows on this node sees the change.
pub async fn submit<'a>(
    image: &watch::Receiver<Arc<ClusterImage>>,
    view: &watch::Receiver<QuorumView>,
    voters: &[Voter],
    timeout: Duration,
    ask: impl Fn(i32) -> BoxFuture<'a, Answer>,
) -> Result<Reply, DriverError> {
    let deadline = tokio::time::Instant::now() + timeout;
    let mut hint: Option<i32> = None;
    let mut next_voter = 0;
    loop {
        let known = view.borrow().leader;
        let target = known.or(hint).or_else(|| {
            next_voter += 1;
            voters.get(next_voter % voters.len().max(1)).map(|v| v.id)
        });
        let answer = match target {
            Some(leader) => ask(leader).await,
            None => Err(DriverError::NotController { leader: None }),
        };
        match answer {
            Ok((reply, offset)) => {
                let mut image = image.clone();
                let applied = tokio::time::timeout_at(deadline, image.wait_for(|i| i.offset >= offset)).await;
                return match applied {
                    Ok(Ok(_)) => Ok(reply),
                    Ok(Err(_)) => Err(DriverError::Stopped),
                    Err(_) => Err(DriverError::Timeout),
                };
            }
            Err(DriverError::Stopped) => return Err(DriverError::Stopped),
            Err(e) if tokio::time::Instant::now() >= deadline => return Err(e),
            Err(DriverError::NotController { leader }) => hint = leader.filter(|l| Some(*l) != target),
            Err(_) => hint = None,
        }
        // Wait for a (new) leader to be known, or a short while.
        let mut view = view.clone();
        let _ = tokio::time::timeout(Duration::from_millis(100), view.changed()).await;
    }
}
