//! Kafka framing: a 4-byte big-endian size, then that many bytes.
//!
//! The size is checked against `socket.request.max.bytes` before anything is
//! allocated for the body, so a hostile length prefix costs nothing.

use bytes::{Buf, Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt};

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

/// Reads one frame; `Ok(None)` on a clean end of stream between frames.
///
/// `buf` is the connection's read buffer and keeps bytes that arrived after
/// the frame for the next call. Frames are split off it without copying,
/// and the socket reads into its spare capacity (no zero-filling first).
pub async fn read_frame<R: AsyncRead + Unpin>(
    reader: &mut R,
    max: usize,
    buf: &mut BytesMut,
) -> Result<Option<Bytes>, FrameError> {
    loop {
        let mut wanted = 4;
        if buf.len() >= 4 {
            let size = i32::from_be_bytes([buf[0], buf[1], buf[2], buf[3]]);
            if size < 0 || size as usize > max {
                return Err(FrameError::BadSize { size: size as i64, max });
            }
            wanted = 4 + size as usize;
            if buf.len() >= wanted {
                buf.advance(4);
                return Ok(Some(buf.split_to(size as usize).freeze()));
            }
        }
        // Room for the rest of this frame (allocated once, at its full size),
        // or a chunk for whatever small requests come next.
        buf.reserve((wanted - buf.len()).max(READ_CHUNK));
        if reader.read_buf(buf).await? == 0 {
            return if buf.is_empty() { Ok(None) } else { Err(FrameError::Truncated) };
        }
    }
}
