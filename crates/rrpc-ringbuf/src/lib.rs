//! RB² distributed ring buffer over the rrpc fabric (issue 3).

mod config;
mod driver;
mod error;
mod mem;
pub mod proto;

pub use config::{
    CACHE_LINE, DEFAULT_SQ_DEPTH, MAX_RING_SIZE, MAX_SLOT_SIZE, MAX_THRESHOLD, MIN_SLOT_COUNT,
    RingConfig, RingConfigBuilder,
};
pub use driver::{
    LOCAL_HEAD_OFFSET, LOCAL_TAIL_OFFSET, LocalRing, RING_OFFSET, ROLE_RING, ReadGuard, RingRx,
    RingTx, RxWatch, TxWatch, WriteGuard,
};
pub use error::Error;
