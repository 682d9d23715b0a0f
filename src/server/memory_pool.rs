//! The broker-wide bound on request bytes in memory
//! (`queued.max.request.bytes`), like Kafka's memory pool.
//!
//! A frame's declared size is reserved when its size prefix arrives, before
//! its body is allocated, and released once the request has been handled.
//! A connection that cannot reserve stops reading (backpressure, not an
//! error) until others release. Waiters are served in arrival order, so a
//! large frame is not starved by a stream of small ones.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

pub struct MemoryPool {
    permits: Arc<Semaphore>,
    capacity: usize,
    /// Connections waiting for room right now (for tests and diagnostics).
    waiting: AtomicUsize,
}

/// Bytes held for one request; returned to the pool on drop.
#[derive(Debug)]
pub struct Reservation {
    _permit: OwnedSemaphorePermit,
}

impl MemoryPool {
    /// A pool of `capacity` bytes; `None` is no bound.
    pub fn new(capacity: Option<usize>) -> MemoryPool {
        let capacity = capacity.unwrap_or(Semaphore::MAX_PERMITS).min(Semaphore::MAX_PERMITS);
        MemoryPool { permits: Arc::new(Semaphore::new(capacity)), capacity, waiting: AtomicUsize::new(0) }
    }

    /// Reserves room for a frame of `size` bytes, waiting while the pool is
    /// short. A frame larger than the whole pool takes the whole pool (it
    /// waits for the pool to drain, never forever). Cancel-safe: dropping the
    /// future reserves nothing.
    pub async fn reserve(&self, size: usize) -> Reservation {
        // Frames are at most socket.request.max.bytes (an i32), so this fits.
        let amount = u32::try_from(size.min(self.capacity)).unwrap_or(u32::MAX);
        if let Ok(permit) = self.permits.clone().try_acquire_many_owned(amount) {
            return Reservation { _permit: permit };
        }
        self.waiting.fetch_add(1, Ordering::Relaxed);
        let _waiting = WaitingGuard(&self.waiting);
        let permit =
            self.permits.clone().acquire_many_owned(amount).await.expect("the pool's semaphore is never closed");
        Reservation { _permit: permit }
    }

    /// Bytes reserved by requests being received or handled.
    pub fn reserved_bytes(&self) -> usize {
        self.capacity - self.permits.available_permits()
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Connections waiting for room.
    pub fn waiting(&self) -> usize {
        self.waiting.load(Ordering::Relaxed)
    }
}

struct WaitingGuard<'a>(&'a AtomicUsize);

impl Drop for WaitingGuard<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn reservations_wait_for_room_and_release_on_drop() {
        let pool = Arc::new(MemoryPool::new(Some(100)));
        let a = pool.reserve(60).await;
        assert_eq!(pool.reserved_bytes(), 60);
        let waiter = tokio::spawn({
            let pool = pool.clone();
            async move { pool.reserve(50).await }
        });
        // The waiter registers (a bounded wait on the condition, not a sleep).
        for _ in 0..10_000 {
            if pool.waiting() > 0 {
                break;
            }
            tokio::task::yield_now().await;
        }
        assert_eq!(pool.waiting(), 1);
        assert!(!waiter.is_finished());
        drop(a);
        let b = waiter.await.unwrap();
        assert_eq!((pool.reserved_bytes(), pool.waiting()), (50, 0));
        drop(b);
        assert_eq!(pool.reserved_bytes(), 0);
    }

    #[tokio::test]
    async fn a_frame_larger_than_the_pool_takes_the_whole_pool() {
        let pool = MemoryPool::new(Some(100));
        let big = pool.reserve(1_000_000).await;
        assert_eq!(pool.reserved_bytes(), 100);
        drop(big);
        let _zero = pool.reserve(0).await;
        assert_eq!(pool.reserved_bytes(), 0);
    }

    #[tokio::test]
    async fn unbounded_pool_never_waits() {
        let pool = MemoryPool::new(None);
        let a = pool.reserve(i32::MAX as usize).await;
        let b = pool.reserve(i32::MAX as usize).await;
        assert_eq!(pool.reserved_bytes(), 2 * i32::MAX as usize);
        drop((a, b));
    }
}
