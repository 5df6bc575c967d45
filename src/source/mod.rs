//! Sources of Kubernetes objects. Every source produces [`crate::objects::Object`]s for the store.

pub mod files;
pub mod watch;
