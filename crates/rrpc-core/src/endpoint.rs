//! Endpoint URIs: `shm:///path/to.sock` and `rdma://host:port`.

use std::fmt;
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;

use crate::error::{Error, Result};

/// Where a server listens or a client connects.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Endpoint {
    /// Same-host shared memory; the side channel is the Unix socket at this path.
    Shm(PathBuf),
    /// RDMA (verbs); the side channel is TCP at this address.
    Rdma(SocketAddr),
}

impl Endpoint {
    /// Parses `shm:///abs/path.sock`, `shm://relative/path.sock` or `rdma://host:port`.
    ///
    /// # Errors
    /// [`Error::InvalidUri`] for other schemes, empty paths or unresolvable hosts.
    pub fn parse(uri: &str) -> Result<Endpoint> {
        let bad = |reason: &str| Error::InvalidUri {
            uri: uri.to_string(),
            reason: reason.to_string(),
        };
        if let Some(rest) = uri.strip_prefix("shm://") {
            if rest.is_empty() {
                return Err(bad("missing socket path (use shm:///path/to.sock)"));
            }
            return Ok(Endpoint::Shm(PathBuf::from(rest)));
        }
        if let Some(rest) = uri.strip_prefix("rdma://") {
            let hostport = rest.trim_end_matches('/');
            let addr = hostport
                .to_socket_addrs()
                .map_err(|e| bad(&format!("cannot resolve {hostport:?}: {e}")))?
                .next()
                .ok_or_else(|| bad("host resolves to no address"))?;
            return Ok(Endpoint::Rdma(addr));
        }
        Err(bad("scheme must be shm:// or rdma://"))
    }
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Endpoint::Shm(p) => write!(f, "shm://{}", p.display()),
            Endpoint::Rdma(a) => write!(f, "rdma://{a}"),
        }
    }
}

impl std::str::FromStr for Endpoint {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        Endpoint::parse(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_schemes() {
        assert_eq!(
            Endpoint::parse("shm:///tmp/a.sock").unwrap(),
            Endpoint::Shm("/tmp/a.sock".into())
        );
        assert_eq!(
            Endpoint::parse("rdma://127.0.0.1:50051").unwrap(),
            Endpoint::Rdma("127.0.0.1:50051".parse().unwrap())
        );
        assert!(matches!(
            Endpoint::parse("http://x"),
            Err(Error::InvalidUri { .. })
        ));
        assert!(matches!(
            Endpoint::parse("shm://"),
            Err(Error::InvalidUri { .. })
        ));
        assert_eq!(Endpoint::parse("shm:///x").unwrap().to_string(), "shm:///x");
    }
}
