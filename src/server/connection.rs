//! One task per connection: read frames, handle them one at a time in arrival
//! order (which is how responses stay in request order, as Kafka requires),
//! and hand responses to a writer task so reading the next request overlaps
//! writing the last response. Record bytes of fetch responses go from the
//! segment files to the socket with `sendfile(2)`, never through userspace.

use std::io;
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncWriteExt, BufWriter, Interest};
use tokio::net::tcp::OwnedWriteHalf;
use tokio::net::TcpStream;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use crate::api::response::Response;
use crate::api::{self, Outcome};
use crate::broker::BrokerState;
use crate::server::frame::FrameReader;

/// Responses queued for the writer before the reader stops taking requests:
/// the bound on in-flight work per connection.
const RESPONSES_QUEUED_MAX: usize = 32;

/// What the writer has left to do, for the idle check: a connection whose
/// responses are still going out is not idle, and its idle time starts when
/// the last one is out.
#[derive(Default)]
struct WriterProgress {
    unwritten: AtomicUsize,
    last_written: Mutex<Option<Instant>>,
}

impl WriterProgress {
    fn written(&self) {
        *self.last_written.lock().unwrap_or_else(|e| e.into_inner()) = Some(Instant::now());
        let _ = self.unwritten.fetch_update(Ordering::Release, Ordering::Relaxed, |n| n.checked_sub(1));
    }
}

pub async fn run(
    state: Arc<BrokerState>,
    socket: TcpStream,
    peer: SocketAddr,
    listener: String,
    mut shutdown: watch::Receiver<bool>,
) {
    let (mut reader, writer) = socket.into_split();
    let (tx, rx) = mpsc::channel::<Queued>(RESPONSES_QUEUED_MAX);
    let progress = Arc::new(WriterProgress::default());
    let writer_task = tokio::spawn(write_loop(writer, rx, peer, progress.clone()));
    let mut frames = FrameReader::new(state.config().socket_request_max_bytes, state.request_pool().clone());
    // connections.max.idle.ms: bytes of a request trickling in do not count
    // as activity, only complete requests and responses do.
    let idle_max = state.config().connections_max_idle_ms.map(Duration::from_millis);
    let mut last_request = Instant::now();
    tracing::debug!(%peer, "connection opened");
    loop {
        // A deadline past what Instant can hold is no deadline.
        let idle_deadline = idle_max.and_then(|max| last_request.checked_add(max));
        let frame = tokio::select! {
            biased;
            _ = crate::server::listener::wait_shutdown(&mut shutdown) => break,
            // The writer gave up (socket error, or records it could not send): close.
            _ = tx.closed() => break,
            frame = frames.next(&mut reader) => frame,
            _ = sleep_until_some(idle_deadline) => {
                let since = idle_since(last_request, &progress);
                let idle = since.map(|t| t.elapsed()).unwrap_or_default();
                let max = idle_max.unwrap_or(Duration::MAX);
                if idle < max {
                    // Answered since, or still answering: not idle yet.
                    last_request = since.unwrap_or_else(Instant::now);
                    continue;
                }
                let idle_ms = idle.as_millis() as u64;
                if frames.mid_frame() {
                    tracing::info!(%peer, idle_ms, "closing connection: request incomplete for longer than connections.max.idle.ms");
                } else {
                    tracing::debug!(%peer, idle_ms, "closing idle connection (connections.max.idle.ms)");
                }
                break;
            }
        };
        let frame = match frame {
            Ok(Some(f)) => f,
            Ok(None) => break,
            Err(e) => {
                tracing::warn!(%peer, error = %e, "closing connection: bad frame");
                break;
            }
        };
        let (frame, reservation) = (frame.bytes, frame.reservation);
        // Kafka's request log, at trace level (RUST_LOG=strand::server::connection=trace):
        // which request, how big, and how long it took to handle.
        let request_log = tracing::enabled!(tracing::Level::TRACE).then(|| {
            (std::time::Instant::now(), frame.get(..2).map(|k| i16::from_be_bytes([k[0], k[1]])), frame.len())
        });
        let outcome = api::handle(&state, &listener, peer, frame, &shutdown).await;
        // The request's bytes are gone with it (responses do not borrow them).
        drop(reservation);
        last_request = Instant::now();
        if let Some((started, api_key, bytes)) = request_log {
            let handled_us = started.elapsed().as_micros() as u64;
            tracing::trace!(%peer, ?api_key, bytes, handled_us, "request");
        }
        match outcome {
            Outcome::Respond(response) => {
                progress.unwritten.fetch_add(1, Ordering::Release);
                if tx.send(Queued::Ready(response)).await.is_err() {
                    break;
                }
            }
            Outcome::Deferred(later) => {
                // Waits on its own task; the writer takes its result in turn.
                progress.unwritten.fetch_add(1, Ordering::Release);
                if tx.send(Queued::Later(tokio::spawn(later))).await.is_err() {
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

/// Sleeps until `deadline`, or forever without one.
async fn sleep_until_some(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

/// When the connection last did something: the later of its last request
/// and its last written response; `None` while responses are still going out.
fn idle_since(last_request: Instant, progress: &WriterProgress) -> Option<Instant> {
    if progress.unwritten.load(Ordering::Acquire) > 0 {
        return None;
    }
    let written = *progress.last_written.lock().unwrap_or_else(|e| e.into_inner());
    Some(written.map_or(last_request, |w| w.max(last_request)))
}

/// A response in the writer's queue: ready, or still being produced.
enum Queued {
    Ready(Response),
    Later(tokio::task::JoinHandle<Outcome>),
}

/// Most bytes one `sendfile` call is asked for (Linux caps a call at about 2 GiB).
const SENDFILE_MAX_BYTES: usize = 1 << 30;

/// Writes responses in order, coalescing whatever is queued into one flush.
async fn write_loop(
    writer: OwnedWriteHalf,
    mut rx: mpsc::Receiver<Queued>,
    peer: SocketAddr,
    progress: Arc<WriterProgress>,
) {
    let mut writer = BufWriter::with_capacity(64 * 1024, writer);
    while let Some(first) = rx.recv().await {
        let mut next = Some(first);
        let mut batch = 0;
        while let Some(queued) = next {
            batch += 1;
            let response = match queued {
                Queued::Ready(r) => r,
                Queued::Later(task) => {
                    // Whatever is buffered goes out while this one waits.
                    if let Err(e) = writer.flush().await {
                        tracing::debug!(%peer, error = %e, "flush failed");
                        return;
                    }
                    match task.await {
                        Ok(Outcome::Respond(r)) => r,
                        Ok(Outcome::Close(reason)) => {
                            tracing::warn!(%peer, %reason, "closing connection");
                            return;
                        }
                        Ok(Outcome::NoResponse) | Ok(Outcome::Deferred(_)) | Err(_) => {
                            tracing::warn!(%peer, "closing connection: a deferred response was lost");
                            return;
                        }
                    }
                }
            };
            if let Err(e) = write_response(&mut writer, &response).await {
                match e {
                    WriteError::Socket(e) => tracing::debug!(%peer, error = %e, "write failed"),
                    // The frame's size prefix is out: the connection cannot continue honestly.
                    WriteError::File { path, error } => tracing::warn!(
                        %peer,
                        file = %path.display(),
                        error = %error,
                        "closing connection: cannot send the fetched records from their segment file"
                    ),
                }
                return;
            }
            next = rx.try_recv().ok();
        }
        if let Err(e) = writer.flush().await {
            tracing::debug!(%peer, error = %e, "flush failed");
            return;
        }
        for _ in 0..batch {
            progress.written();
        }
    }
    let _ = writer.shutdown().await;
}

enum WriteError {
    Socket(io::Error),
    File { path: Arc<std::path::PathBuf>, error: io::Error },
}

impl From<io::Error> for WriteError {
    fn from(e: io::Error) -> Self {
        WriteError::Socket(e)
    }
}

/// Writes one frame: its bytes through the buffer, its file regions with
/// `sendfile` after flushing what precedes them. Bytes after the last region
/// stay buffered, to be coalesced with the next responses.
async fn write_response(writer: &mut BufWriter<OwnedWriteHalf>, response: &Response) -> Result<(), WriteError> {
    let mut written = 0;
    for region in &response.files {
        writer.write_all(&response.bytes[written..region.at]).await?;
        writer.flush().await?;
        let socket: &TcpStream = writer.get_ref().as_ref();
        send_file(socket, &region.slice).await?;
        written = region.at;
    }
    writer.write_all(&response.bytes[written..]).await?;
    Ok(())
}

/// Sends `slice` from its file to the non-blocking socket with `sendfile`,
/// waiting for the socket to be writable whenever its buffer is full.
async fn send_file(socket: &TcpStream, slice: &strand_storage::FileSlice) -> Result<(), WriteError> {
    let file_error = |error| WriteError::File { path: slice.path.clone(), error };
    let end = slice.position + slice.len as u64;
    let mut offset = libc::off_t::try_from(slice.position)
        .map_err(|_| file_error(io::Error::new(io::ErrorKind::InvalidInput, "file position out of range")))?;
    let socket_fd = socket.as_raw_fd();
    let file_fd = slice.file.as_raw_fd();
    while (offset as u64) < end {
        let count = ((end - offset as u64) as usize).min(SENDFILE_MAX_BYTES);
        socket.writable().await?;
        let sent = socket.try_io(Interest::WRITABLE, || {
            // SAFETY: both descriptors are open for the duration of the call (the
            // socket is borrowed, the file held by the slice's Arc), and `offset`
            // is a valid off_t the kernel advances by what it sent.
            let n = unsafe { libc::sendfile(socket_fd, file_fd, &mut offset, count) };
            if n < 0 {
                Err(io::Error::last_os_error())
            } else {
                Ok(n as usize)
            }
        });
        match sent {
            Ok(0) => {
                let at = offset as u64 - slice.position;
                return Err(file_error(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!(
                        "file ends {at} bytes into a {}-byte region at position {} (truncated?)",
                        slice.len, slice.position
                    ),
                )));
            }
            Ok(_) => {}
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted) => {}
            Err(e) if is_socket_error(&e) => return Err(WriteError::Socket(e)),
            Err(e) => return Err(file_error(e)),
        }
    }
    Ok(())
}

/// Errors that mean the peer is gone rather than the file is unreadable.
fn is_socket_error(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::BrokenPipe
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::NotConnected
    )
}

#[cfg(test)]
mod tests {
    use std::fs::File;
    use std::io::Write;
    use std::path::PathBuf;

    use bytes::BytesMut;
    use strand_storage::FileSlice;
    use tokio::io::AsyncReadExt;
    use tokio::net::TcpListener;

    use super::*;
    use crate::api::response::FileRegion;

    /// A connected pair: the broker side's write half and the client side.
    async fn pair() -> (OwnedWriteHalf, TcpStream, SocketAddr) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let client = TcpStream::connect(addr).await.unwrap();
        let (server, peer) = listener.accept().await.unwrap();
        let (_read, write) = server.into_split();
        (write, client, peer)
    }

    fn file_with(dir: &tempfile::TempDir, content: &[u8]) -> (Arc<File>, Arc<PathBuf>) {
        let path = dir.path().join("00000000000000000000.log");
        File::create(&path).unwrap().write_all(content).unwrap();
        (Arc::new(File::open(&path).unwrap()), Arc::new(path))
    }

    fn region(file: &(Arc<File>, Arc<PathBuf>), at: usize, position: u64, len: usize) -> FileRegion {
        FileRegion { at, slice: FileSlice { file: file.0.clone(), path: file.1.clone(), position, len } }
    }

    /// Goal: file regions larger than the socket buffer go out whole and in
    /// place (partial sends, waiting for writability), between the frame's
    /// bytes, and queued responses follow in order.
    #[tokio::test]
    async fn file_regions_are_spliced_into_the_stream() {
        let dir = tempfile::tempdir().unwrap();
        let content: Vec<u8> = (0..8usize << 20).map(|i| (i % 251) as u8).collect();
        let file = file_with(&dir, &content);
        let (write, mut client, peer) = pair().await;
        let (tx, rx) = mpsc::channel(4);
        let first = Response {
            bytes: BytesMut::from(&b"head|mid|tail"[..]),
            files: vec![region(&file, 5, 1, 6 << 20), region(&file, 5, 7 << 20, 1000), region(&file, 9, 0, 10)],
        };
        tx.send(Queued::Ready(first)).await.unwrap();
        tx.send(Queued::Ready(Response::bytes(BytesMut::from(&b"next"[..])))).await.unwrap();
        drop(tx);
        // The 6 MiB region is larger than any socket buffer, so the writer
        // meets a full socket (partial sends, waits for writability) whatever
        // the timing of the reads below.
        let writer = tokio::spawn(write_loop(write, rx, peer, Default::default()));
        let mut got = Vec::new();
        client.read_to_end(&mut got).await.unwrap();
        writer.await.unwrap();
        let mut expected = b"head|".to_vec();
        expected.extend_from_slice(&content[1..1 + (6 << 20)]);
        expected.extend_from_slice(&content[7 << 20..(7 << 20) + 1000]);
        expected.extend_from_slice(b"mid|");
        expected.extend_from_slice(&content[..10]);
        expected.extend_from_slice(b"tailnext");
        assert_eq!(got.len(), expected.len());
        assert!(got == expected, "stream differs from the frame with its file regions");
    }

    /// Goal: a file shorter than its region (truncated underneath) ends the
    /// connection after what could be sent; nothing after it is written.
    #[tokio::test]
    async fn a_short_file_closes_the_connection() {
        let dir = tempfile::tempdir().unwrap();
        let file = file_with(&dir, &[7u8; 100]);
        let (write, mut client, peer) = pair().await;
        let (tx, rx) = mpsc::channel(4);
        tx.send(Queued::Ready(Response {
            bytes: BytesMut::from(&b"headtail"[..]),
            files: vec![region(&file, 4, 50, 100)],
        }))
        .await
        .unwrap();
        tx.send(Queued::Ready(Response::bytes(BytesMut::from(&b"next"[..])))).await.unwrap();
        drop(tx);
        write_loop(write, rx, peer, Default::default()).await;
        let mut got = Vec::new();
        client.read_to_end(&mut got).await.unwrap();
        let mut expected = b"head".to_vec();
        expected.extend_from_slice(&[7u8; 50]);
        assert_eq!(got, expected);
    }
}
