//! The network side: a listener per configured listener, one task per
//! connection, and the shutdown signal they share.

pub mod connection;
pub mod frame;
pub mod listener;
pub mod memory_pool;

pub use listener::serve;
