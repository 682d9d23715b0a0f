//! Kafka framing: a 4-byte big-endian size, then that many bytes.
//!
//! The size is checked against `socket.request.max.bytes` and reserved from
//! the broker's request memory pool (`queued.max.request.bytes`) before
//! anything is allocated for the body, so a hostile length prefix costs
//! nothing and many large requests at once wait for room instead of growing
//! memory without bound.

use std::sync::Arc;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt};

use crate::server::memory_pool::{MemoryPool, Reservation};

#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    #[error("request size {size} is outside 0..={max} (socket.request.max.bytes)")]
    BadSize { size: i64, max: usize },
    #[error("connection closed mid-frame")]
    Truncated,
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

/// How much to ask the socket for at least, so several small pipelined
/// requests arrive with one read.
const READ_CHUNK: usize = 64 * 1024;

/// One request frame and the pool bytes it holds; drop the reservation once
/// the request has been handled.
pub struct Frame {
    pub bytes: Bytes,
    pub reservation: Reservation,
}

/// A frame whose size prefix has arrived and whose bytes are reserved.
struct Partial {
    size: usize,
    reservation: Reservation,
    /// The body of a frame larger than [`READ_CHUNK`], in its own buffer of
    /// exactly its size, so the memory goes back with the request (a shared
    /// connection buffer would keep the largest frame's allocation alive).
    /// Smaller frames are split off the connection buffer.
    body: Option<BytesMut>,
}

/// Reads one connection's frames.
pub struct FrameReader {
    max: usize,
    pool: Arc<MemoryPool>,
    /// Bytes read but not yet framed; kept between calls.
    buf: BytesMut,
    current: Option<Partial>,
}

impl FrameReader {
    pub fn new(max: usize, pool: Arc<MemoryPool>) -> FrameReader {
        FrameReader { max, pool, buf: BytesMut::new(), current: None }
    }

    /// Whether part of a request has arrived (a frame is being received).
    pub fn mid_frame(&self) -> bool {
        self.current.is_some() || !self.buf.is_empty()
    }

    /// Reads the next frame; `Ok(None)` on a clean end of stream between
    /// frames. Cancel-safe: what has arrived stays in the reader.
    ///
    /// The socket reads into spare capacity (no zero-filling first), and
    /// frames are split off their buffer without copying.
    pub async fn next<R: AsyncRead + Unpin>(&mut self, reader: &mut R) -> Result<Option<Frame>, FrameError> {
        loop {
            if self.current.is_none() && self.buf.len() >= 4 {
                let size = i32::from_be_bytes([self.buf[0], self.buf[1], self.buf[2], self.buf[3]]);
                if size < 0 || size as usize > self.max {
                    return Err(FrameError::BadSize { size: size as i64, max: self.max });
                }
                let size = size as usize;
                // Waiting here is the backpressure: nothing more is read from
                // this connection until its request fits in the pool.
                let reservation = self.pool.reserve(size).await;
                self.buf.advance(4);
                let body = (size > READ_CHUNK && self.buf.len() < size).then(|| {
                    let mut body = BytesMut::with_capacity(size);
                    body.extend_from_slice(&self.buf);
                    self.buf.clear();
                    body
                });
                self.current = Some(Partial { size, reservation, body });
            }
            if let Some(partial) = &self.current {
                let complete = match &partial.body {
                    Some(body) => body.len() == partial.size,
                    None => self.buf.len() >= partial.size,
                };
                if complete {
                    let Partial { size, reservation, body } = self.current.take().expect("checked above");
                    let bytes = match body {
                        Some(body) => body.freeze(),
                        None => self.buf.split_to(size).freeze(),
                    };
                    return Ok(Some(Frame { bytes, reservation }));
                }
            }
            let read = match &mut self.current {
                Some(Partial { size, body: Some(body), .. }) => {
                    // Exactly the rest of this frame: its buffer never grows.
                    let rest = *size - body.len();
                    reader.read_buf(&mut body.limit(rest)).await?
                }
                _ => {
                    self.buf.reserve(READ_CHUNK);
                    reader.read_buf(&mut self.buf).await?
                }
            };
            if read == 0 {
                return if self.mid_frame() { Err(FrameError::Truncated) } else { Ok(None) };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::AsyncWriteExt;

    use super::*;

    fn frame(body: &[u8]) -> Vec<u8> {
        let mut f = (body.len() as i32).to_be_bytes().to_vec();
        f.extend_from_slice(body);
        f
    }

    /// Goal: small pipelined frames and a large one split across reads come
    /// out whole and in order; each holds its size in the pool until dropped.
    #[tokio::test]
    async fn frames_are_read_whole_and_hold_their_reservation() {
        let pool = Arc::new(MemoryPool::new(Some(1 << 20)));
        let (mut client, mut server) = tokio::io::duplex(4096);
        let large: Vec<u8> = (0..200_000u32).map(|i| i as u8).collect();
        let mut stream = frame(b"one");
        stream.extend(frame(b"two"));
        stream.extend(frame(&large));
        stream.extend(frame(b""));
        let writer = tokio::spawn(async move {
            client.write_all(&stream).await.unwrap();
        });
        let mut reader = FrameReader::new(1 << 20, pool.clone());
        let one = reader.next(&mut server).await.unwrap().unwrap();
        assert_eq!(&one.bytes[..], b"one");
        assert_eq!(pool.reserved_bytes(), 3);
        drop(one);
        let two = reader.next(&mut server).await.unwrap().unwrap();
        assert_eq!(&two.bytes[..], b"two");
        drop(two);
        let big = reader.next(&mut server).await.unwrap().unwrap();
        assert!(big.bytes[..] == large[..]);
        assert_eq!(pool.reserved_bytes(), large.len());
        drop(big);
        let empty = reader.next(&mut server).await.unwrap().unwrap();
        assert!(empty.bytes.is_empty());
        drop(empty);
        writer.await.unwrap();
        assert!(reader.next(&mut server).await.unwrap().is_none(), "clean end of stream");
        assert_eq!(pool.reserved_bytes(), 0);
    }

    #[tokio::test]
    async fn bad_sizes_and_truncation_are_errors() {
        let pool = Arc::new(MemoryPool::new(Some(1 << 20)));
        for prefix in [-1i32, 1025] {
            let mut input = &prefix.to_be_bytes()[..];
            let err = FrameReader::new(1024, pool.clone()).next(&mut input).await.err().unwrap();
            assert!(matches!(err, FrameError::BadSize { .. }), "{err}");
        }
        let mut input = &frame(b"abcdef")[..7];
        let err = FrameReader::new(1024, pool.clone()).next(&mut input).await.err().unwrap();
        assert!(matches!(err, FrameError::Truncated), "{err}");
        assert_eq!(pool.reserved_bytes(), 0, "a dropped partial frame releases its reservation");
    }
}
