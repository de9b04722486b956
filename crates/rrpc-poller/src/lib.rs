//! BP, BPTS, EVENT and BPEV connection management feeding tokio (to be built: issue 4).
