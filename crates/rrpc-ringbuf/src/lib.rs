//! RB² distributed ring buffer over the rrpc fabric (issue 3).

mod config;
mod error;
pub mod proto;

pub use config::{
    CACHE_LINE, DEFAULT_SQ_DEPTH, MAX_RING_SIZE, MAX_SLOT_SIZE, MAX_THRESHOLD, MIN_SLOT_COUNT,
    RingConfig, RingConfigBuilder,
};
pub use error::Error;
