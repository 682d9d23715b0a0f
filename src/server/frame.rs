//! Kafka framing: a 4-byte big-endian size, then that many bytes.
//!
//! The size is checked against `socket.request.max.bytes` before anything is
//! allocated for the body, so a hostile length prefix costs nothing.

use bytes::{Bytes, BytesMut};
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

/// Reads one frame; `Ok(None)` on a clean end of stream between frames.
pub async fn read_frame<R: AsyncRead + Unpin>(
    reader: &mut R,
    max: usize,
    buf: &mut BytesMut,
) -> Result<Option<Bytes>, FrameError> {
    let mut size = [0u8; 4];
    match reader.read_exact(&mut size).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e.into()),
    }
    let size = i32::from_be_bytes(size);
    if size < 0 || size as usize > max {
        return Err(FrameError::BadSize { size: size as i64, max });
    }
    buf.clear();
    buf.resize(size as usize, 0);
    match reader.read_exact(&mut buf[..]).await {
        Ok(_) => Ok(Some(buf.split().freeze())),
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => Err(FrameError::Truncated),
        Err(e) => Err(e.into()),
    }
}
