//! What both side channels share while they exchange hellos: the
//! deadline, the grants offered and received, the hello, and the errors
//! and reject codes either side may send.

use std::io;
use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::handshake::{Hello, RegionDesc, Reject, RejectCode, Section};
use crate::region::{Region, RemoteRegion};
use crate::settings::ProviderKind;

use super::budget::BudgetGuard;

// ---------------------------------------------------------------------------
// Deadline and budget
// ---------------------------------------------------------------------------

/// The instant a whole handshake must be done by. Every read and write sets
/// the socket timeout to the time left, so the total never exceeds it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Deadline(Instant);

impl Deadline {
    pub(crate) fn after(d: Duration) -> Deadline {
        let now = Instant::now();
        // A timeout too large to add is as good as a year.
        Deadline(
            now.checked_add(d)
                .unwrap_or_else(|| now + Duration::from_secs(365 * 86_400)),
        )
    }

    /// The time left.
    ///
    /// # Errors
    /// [`Error::Timeout`] once the deadline has passed.
    pub(crate) fn remaining(&self) -> Result<Duration> {
        let left = self.0.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(Error::Timeout);
        }
        Ok(left)
    }
}

/// What one side offers in the handshake.
#[derive(Debug, Clone, Default)]
pub struct Offer {
    pub(crate) token: Option<Vec<u8>>,
    pub(crate) sections: Vec<Section>,
    pub(crate) grants: Vec<(u16, Arc<Region>)>,
}

impl Offer {
    /// An empty offer.
    pub fn new() -> Self {
        Self::default()
    }
    /// The token to present to the server.
    pub fn token(mut self, token: Option<Vec<u8>>) -> Self {
        self.token = token;
        self
    }
    /// Adds a layer's part of the hello under `tag`, replacing an earlier
    /// one with the same tag. The fabric carries it and reads none of it;
    /// the peer finds it with [`PeerInfo::section`]. At most
    /// [`MAX_SECTIONS`](crate::handshake::MAX_SECTIONS) sections of
    /// [`MAX_SECTION`](crate::handshake::MAX_SECTION) bytes: a connect with
    /// more fails with [`Error::InvalidConfig`] before anything is sent.
    pub fn section(mut self, tag: u16, bytes: Vec<u8>) -> Self {
        match self.sections.iter_mut().find(|s| s.tag == tag) {
            Some(s) => s.bytes = bytes,
            None => self.sections.push(Section { tag, bytes }),
        }
        self
    }
    /// Grants `region` to the peer under `role`.
    pub fn grant(mut self, role: u16, region: Arc<Region>) -> Self {
        self.grants.push((role, region));
        self
    }
    /// The regions granted so far.
    pub fn grants(&self) -> &[(u16, Arc<Region>)] {
        &self.grants
    }
}

/// What the peer offered.
#[derive(Debug, Clone)]
pub struct PeerInfo {
    /// The layers' parts of the peer's hello (each tag at most once).
    pub sections: Vec<Section>,
    /// The regions the peer granted us.
    pub regions: Vec<RegionDesc>,
    /// The peer's provider.
    pub provider: ProviderKind,
}

impl PeerInfo {
    /// The first region granted under `role`.
    pub fn region(&self, role: u16) -> Option<RemoteRegion> {
        self.regions
            .iter()
            .find(|d| d.role == role)
            .map(|d| d.remote)
    }

    /// The bytes of the section the peer sent under `tag`.
    pub fn section(&self, tag: u16) -> Option<&[u8]> {
        self.sections
            .iter()
            .find(|s| s.tag == tag)
            .map(|s| s.bytes.as_slice())
    }
}

/// What came with a client's hello besides its bytes: on shm the
/// descriptors it passed and its grants' reservation against the listener's
/// budget; on verbs nothing.
#[derive(Debug, Default)]
pub(crate) struct Passed {
    /// Every descriptor the client passed, owned (closed on every path).
    pub(crate) fds: Vec<OwnedFd>,
    /// The client's grants, reserved against the listener's budget.
    pub(crate) budget: Option<BudgetGuard>,
}

pub(crate) fn map_io(op: &'static str, e: io::Error) -> Error {
    match e.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => Error::Timeout,
        io::ErrorKind::UnexpectedEof
        | io::ErrorKind::BrokenPipe
        | io::ErrorKind::ConnectionReset
        | io::ErrorKind::ConnectionAborted => Error::PeerGone,
        _ => Error::io(op, e),
    }
}

// ---------------------------------------------------------------------------
// Hello construction and attachment (provider specific)
// ---------------------------------------------------------------------------

/// The provider-neutral part of our hello: token, grants, sections.
pub(crate) fn base_hello(offer: &Offer) -> Hello {
    Hello {
        token: offer.token.clone(),
        provider: 0,
        endpoint: Vec::new(),
        regions: offer
            .grants
            .iter()
            .map(|(role, r)| RegionDesc {
                role: *role,
                remote: r.remote(),
            })
            .collect(),
        sections: offer.sections.clone(),
    }
}

pub(crate) fn peer_info(h: &Hello, expected: ProviderKind) -> Result<PeerInfo> {
    let provider = ProviderKind::from_code(h.provider).ok_or_else(|| {
        Error::MalformedHandshake(format!("unknown provider code {}", h.provider))
    })?;
    if provider != expected {
        return Err(Error::MalformedHandshake(format!(
            "peer offers provider {provider:?} where {expected:?} was expected"
        )));
    }
    Ok(PeerInfo {
        sections: h.sections.clone(),
        regions: h.regions.clone(),
        provider,
    })
}

/// The reject code for an error found while checking a peer's hello or
/// setting its connection up.
pub(crate) fn reject_code_for(e: &Error) -> RejectCode {
    match e {
        Error::LimitExceeded { .. } => RejectCode::Busy,
        Error::VersionMismatch { .. } => RejectCode::Version,
        Error::AuthFailed => RejectCode::Auth,
        e if e.fault() == crate::Fault::Device => RejectCode::Unavailable,
        _ => RejectCode::Malformed,
    }
}

/// The client's error for the server's `Reject`.
pub(crate) fn reject_error(r: Reject) -> Error {
    match r.code {
        RejectCode::Auth => Error::AuthFailed,
        RejectCode::Unavailable => Error::PeerUnavailable(r.reason),
        _ => Error::Rejected(r.reason),
    }
}
