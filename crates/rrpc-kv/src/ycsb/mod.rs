//! The YCSB driver (in progress).
