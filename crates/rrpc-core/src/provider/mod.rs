//! Fabric providers. Everything above `rrpc-core` sees only the provider-neutral
//! types ([`crate::Region`], [`crate::QueuePair`], [`crate::CompletionQueue`]).

pub(crate) mod shm;
#[cfg(feature = "verbs")]
pub(crate) mod verbs;
