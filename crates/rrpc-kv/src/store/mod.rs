//! Jakiro's store (in progress).
