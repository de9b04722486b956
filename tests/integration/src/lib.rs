//! Shared harness for the integration tests (see `tests/`).
