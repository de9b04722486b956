//! A Jakiro-like key-value store over RF-RPC (not started; see the README status table).
