//! Talking to HAProxy: typed runtime API and master CLI commands ([`command`]), a socket
//! client with timeouts ([`client`]), and the master-worker process ([`process`]).

pub mod client;
pub use portcullis_core::plan::command;
pub mod process;
