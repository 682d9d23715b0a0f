//! Room for more open files: descriptors open now (`/proc/self/fd`) against
//! the soft `RLIMIT_NOFILE`. Partitions are created only when they fit, so a
//! create that cannot succeed is refused whole instead of failing half way
//! with EMFILE (and leaving the broker without descriptors for anything else).

/// Descriptors a new partition holds: one, for its active segment's log file
/// (read and append on one descriptor; index files hold none once mapped).
/// Each later segment holds one more, as in Kafka, so a broker with many
/// partitions and segments needs a high RLIMIT_NOFILE; `HEADROOM` covers
/// rolls in the meantime. The `fds_per_partition` test in
/// tests/create_atomic.rs measures it.
pub const FDS_PER_PARTITION: u64 = 1;

/// Descriptors left free after a create: client sockets, segment rolls, the
/// metadata file, and the few each opening thread holds for a moment.
pub const HEADROOM: u64 = 256;

/// The process's descriptor usage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FdRoom {
    pub open: u64,
    pub limit: u64,
}

impl FdRoom {
    /// Now; `None` when the limit is infinite or usage cannot be read (no
    /// `/proc`), in which case nothing is refused.
    pub fn current() -> Option<FdRoom> {
        let mut rlim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        // SAFETY: getrlimit writes one rlimit struct we own.
        if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut rlim) } != 0 || rlim.rlim_cur == libc::RLIM_INFINITY {
            return None;
        }
        // The directory handle itself is one entry; it is closed again at once.
        let open = std::fs::read_dir("/proc/self/fd").ok()?.count().saturating_sub(1) as u64;
        Some(FdRoom { open, limit: rlim.rlim_cur })
    }

    /// How many more partitions fit, keeping [`HEADROOM`] free.
    pub fn partitions_that_fit(&self) -> u64 {
        self.limit.saturating_sub(self.open).saturating_sub(HEADROOM) / FDS_PER_PARTITION
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn room_is_the_free_descriptors_less_headroom() {
        let room = FdRoom { open: 100, limit: 1024 };
        assert_eq!(room.partitions_that_fit(), (1024 - 100 - HEADROOM) / FDS_PER_PARTITION);
        assert_eq!(FdRoom { open: 900, limit: 1024 }.partitions_that_fit(), 0);
        assert_eq!(FdRoom { open: 2000, limit: 1024 }.partitions_that_fit(), 0);
    }

    #[test]
    fn current_usage_is_read_on_linux() {
        // stdin, stdout and stderr at least (None only without a finite limit).
        if let Some(room) = FdRoom::current() {
            assert!(room.open >= 3 && room.open <= room.limit, "{room:?}");
        }
    }
}
