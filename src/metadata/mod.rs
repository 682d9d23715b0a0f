//! What a broker knows about the cluster.
//!
//! - [`store`]: the single node's persisted topic registry and cluster
//!   identity (one JSON file), used when no quorum is configured.
//! - [`records`]: the records of the cluster metadata log (the raft log of
//!   the controller quorum).
//! - [`image`]: the [`image::ClusterImage`] those records build, versioned
//!   by the offset of the last record applied.
//! - [`placement`]: where new partitions' replicas and leaders go.

pub mod image;
pub mod placement;
pub mod records;
mod store;

pub use store::*;
