//! Connection establishment over a side channel, and liveness afterwards.
//!
//! The server [`Listener::bind`]s a side channel (a Unix socket for shm); the
//! client [`connect`]s and sends a `Hello` (see [`crate::handshake`]) carrying
//! its token, queue-pair endpoint, the regions it grants and the layers'
//! sections (the ring's parameters among them) —
//! on shm the regions' memfds, its receive queue and its doorbell travel along
//! as `SCM_RIGHTS`. The server checks version and token, answers `Accept` with
//! its own grants (or `Reject` with a reason) and both sides attach their queue
//! pairs to each other. One round trip; resources can come pre-made from a
//! [`crate::pool::ResourcePool`] (KRCore §3.1).
//!
//! ## A peer is not trusted
//!
//! Both sides check what the other sends; a bad peer gets a `Reject` naming
//! the problem (where the protocol allows one), a typed error, a closed
//! socket, and nothing of ours:
//!
//! * **Time.** [`HandshakeConfig::timeout`] (5 s) is a deadline for the whole
//!   handshake, not for each read: a peer that trickles bytes is cut off
//!   when it passes ([`Error::Timeout`]). Servers run
//!   [`Listener::accept_pending`] in their accept loop and each
//!   [`Pending::handshake`] on its own thread or task once the whole hello
//!   has arrived, so one slow client delays nobody else. Clients that must
//!   not hold a thread for the round trip split [`connect`] around its one
//!   wait with [`Dialing`] (on shm; `rdma://` dials in one piece).
//! * **Descriptors.** Every descriptor received with `SCM_RIGHTS` is owned
//!   (and closed on every path) from the moment it arrives, truncated control
//!   data included; a hello carries at most `MAX_REGIONS + 2` (18).
//! * **Kinds.** Regions and the receive queue must be memfds sealed against
//!   shrinking and growing, at least as long as claimed; the doorbell must be
//!   a pipe's write end, and is written with `pwritev2(RWF_NOWAIT)` (never
//!   blocks, whatever the peer does to its end).
//! * **Memory.** At most [`crate::handshake::MAX_REGIONS`] (16) regions per
//!   hello; at most [`HandshakeConfig::max_grant_bytes`] (default 1 GiB +
//!   64 MiB) granted in one handshake, on both sides; at most
//!   [`HandshakeConfig::max_total_grant_bytes`] (default 64 GiB) mapped for
//!   the peers of one [`Listener`] at once, and at most
//!   [`HandshakeConfig::max_peer_grant_bytes`] (default 16 GiB) of that for
//!   one peer ([`PeerKey`]: a process, by `SO_PEERCRED`), so that no peer can
//!   lock the others out; near the end of the total the peer holding the
//!   most is refused first. Bytes return when a connection's queue pair is
//!   dropped. Refusals are [`Error::LimitExceeded`].
//!
//! The side channel then stays open as the liveness signal: when it closes —
//! the peer exited, crashed or called [`Connection::close`] — the connection is
//! failed with [`Error::PeerGone`] and so is its queue pair, so every later post
//! returns that error instead of writing into memory nobody reads. On
//! `rdma://` the side channel is TCP, and a remote *host* that dies without
//! closing it (power loss, hang, network cut) sends no FIN: TCP keep-alive
//! and `TCP_USER_TIMEOUT` ([`HandshakeConfig::keepalive`], [`TcpKeepalive`])
//! fail the socket within 16 s by default (10 s idle + 3 probes 2 s apart),
//! and the connection then reports [`Error::PeerUnresponsive`], naming the
//! bound, and fails its queue pair with it. A lane has no side channel of
//! its own: its liveness is a [`Liveness`] its lane reader ends when the
//! lane closes or its shared connection fails ([`Connection::liveness`]).
//!
//! ## Layers
//!
//! * `settings` ([`HandshakeConfig`], [`TcpKeepalive`]), `exchange`
//!   ([`Offer`], [`PeerInfo`], the deadline, the hello's provider-neutral
//!   part), `budget` ([`PeerKey`]) and `liveness` ([`Liveness`]) are
//!   leaves: of this module they import only each other, and no provider.
//! * `dial` ([`connect`], [`Dialing`]) and `accept` ([`Listener`], [`Pending`],
//!   [`Incoming`]) run the handshake; `established` ([`Connection`]) is the
//!   connection and its liveness; `logical` ([`SharedConnection`],
//!   [`connect_logical`]) builds on both.
//! * `lanes` (`SharedConnection::lane_*`) drives `mux` over a
//!   [`SharedConnection`]'s side channel (shm); what it holds
//!   ([`LaneArenas`], [`LaneEvent`], [`LaneSlots`]) is in `arenas`, a leaf
//!   that `logical` imports too.
//! * `mux` (logical connections over a shared connection's open side
//!   channel, their rings in arenas granted ahead: the messages and the
//!   protocol, sans IO) is a leaf too: it imports only the error.
//! * None of them names a provider. The side channels (a Unix socket with
//!   descriptor passing for shm, TCP with optional TLS for verbs) are the
//!   providers', behind one seam, `provider::side`: its `SideListener` and
//!   `Side` enums (one variant per provider) and its `dial` /
//!   `dial_logical` are all this module calls when a provider must be
//!   told apart. The side channels build on the leaves above and on
//!   [`crate::QueuePair`], never on the rest of this module: no circle.
//!   Only the TLS settings (`TlsClient` and `HandshakeConfig`'s
//!   `tls_server` / `tls_client`), public API of the `verbs` feature, are
//!   `cfg(feature = "verbs")` here.

// Named by the docs.
#[cfg(doc)]
use crate::error::Error;

mod accept;
mod arenas;
pub(crate) mod budget;
mod dial;
pub(crate) mod established;
pub(crate) mod exchange;
mod lanes;
mod liveness;
mod logical;
pub mod mux;
pub(crate) mod settings;

pub use accept::{Incoming, Listener, Pending};
pub use arenas::{
    LANE_WARM_BYTES, LANE_WARM_SLOTS, LANE_WARM_TAIL, LANE_WRITE_WAIT, LaneArenas, LaneEvent,
    LaneSlots, ROLE_ARENA,
};
pub(crate) use budget::BudgetGuard;
pub use budget::{DEFAULT_MAX_PEER_GRANT_BYTES, NEAR_END_DIVISOR, PeerKey};
pub use dial::{Dialing, connect};
pub use established::Connection;
pub use exchange::{Offer, PeerInfo};
pub use liveness::{Liveness, LivenessWatch};
pub use logical::{GRANT_LEASE, SharedConnection, connect_logical};
#[cfg(feature = "verbs")]
pub use settings::TlsClient;
pub use settings::{
    DEFAULT_MAX_GRANT_BYTES, DEFAULT_MAX_TOTAL_GRANT_BYTES, HandshakeConfig,
    HandshakeConfigBuilder, TcpKeepalive, Want,
};

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::error::Error;

    #[test]
    fn keepalive_timers_are_validated() {
        let s = Duration::from_secs;
        assert!(TcpKeepalive::new(s(1), s(1), 1).is_ok());
        assert!(TcpKeepalive::new(s(32767), s(32767), 127).is_ok());
        for (idle, interval, count, says) in [
            (
                s(0),
                s(1),
                1,
                "idle must be whole seconds in 1..=32767 s, got 0ns",
            ),
            (s(32768), s(1), 1, "idle"),
            (Duration::from_millis(1500), s(1), 1, "got 1.5s"),
            (s(1), s(0), 1, "interval"),
            (s(1), s(1), 0, "count must be in 1..=127, got 0"),
            (s(1), s(1), 128, "got 128"),
        ] {
            let e = TcpKeepalive::new(idle, interval, count).unwrap_err();
            assert!(matches!(e, Error::InvalidConfig(_)));
            assert!(e.to_string().contains(says), "{e}");
        }
    }

    #[test]
    fn keepalive_is_on_by_default_with_a_16_s_bound() {
        let k = HandshakeConfig::default()
            .keepalive()
            .expect("on by default");
        assert_eq!(
            (k.idle(), k.interval(), k.count()),
            (Duration::from_secs(10), Duration::from_secs(2), 3)
        );
        assert_eq!(k.bound(), Duration::from_secs(16));
        assert_eq!(
            HandshakeConfig::builder()
                .keepalive(None)
                .build()
                .unwrap()
                .keepalive(),
            None
        );
    }
}
