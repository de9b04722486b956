//! Shared helpers for the rrpc benchmark suites (reports, machine header).
