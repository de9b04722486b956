//! Fabric addresses: `shm:///path/to.sock` and `rdma://host:port` URIs,
//! parsed once ([`FabricUri`]) and resolved on demand ([`FabricAddr`]).
//!
//! Named `FabricAddr`/`FabricUri` (formerly `Endpoint`/`EndpointUri`) so
//! they are not taken for rrpc-tonic's `RrpcEndpoint` (a tonic-style channel
//! builder) nor for a queue pair's address in the handshake.

use std::fmt;
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;

use crate::error::{Error, Result};

/// Where a server listens or a client connects: a resolved fabric address
/// (the Unix socket path of `shm://`, the TCP side channel's socket address
/// of `rdma://`).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum FabricAddr {
    /// Same-host shared memory; the side channel is the Unix socket at this path.
    Shm(PathBuf),
    /// RDMA (verbs); the side channel is TCP at this address.
    Rdma(SocketAddr),
}

/// The old name of [`FabricAddr`].
#[deprecated(note = "renamed to `FabricAddr`")]
pub type Endpoint = FabricAddr;

/// The old name of [`FabricUri`].
#[deprecated(note = "renamed to `FabricUri`")]
pub type EndpointUri = FabricUri;

impl FabricAddr {
    /// Parses `shm:///abs/path.sock` or `rdma://host:port` and resolves the
    /// host ([`FabricUri::parse`], then [`FabricUri::resolve`]).
    ///
    /// # Errors
    /// [`Error::InvalidUri`] as [`FabricUri::parse`], or for a host that
    /// does not resolve.
    pub fn parse(uri: &str) -> Result<FabricAddr> {
        FabricUri::parse(uri)?.resolve()
    }
}

/// An rrpc URI as written, before name resolution: the one grammar of
/// `shm://` and `rdma://` (rrpc-tonic parses its URIs with it too).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum FabricUri {
    /// `shm:///abs/path.sock`: the Unix socket at this absolute path.
    Shm(PathBuf),
    /// `rdma://host:port`: the side channel's TCP address, host unresolved
    /// (a name, an IPv4 address, or a bracketed IPv6 address).
    Rdma {
        /// The host as written, brackets removed.
        host: String,
        /// The port.
        port: u16,
    },
}

impl FabricUri {
    /// Parses `shm:///abs/path.sock` or `rdma://host:port` (a trailing `/`
    /// is ignored). A relative `shm://` path is refused: the client and the
    /// server would resolve it against different working directories.
    ///
    /// # Errors
    /// [`Error::InvalidUri`] naming what is wrong.
    pub fn parse(uri: &str) -> Result<FabricUri> {
        let bad = |reason: &str| Error::InvalidUri {
            uri: uri.to_string(),
            reason: reason.to_string(),
        };
        if let Some(rest) = uri.strip_prefix("shm://") {
            if rest.is_empty() {
                return Err(bad("missing socket path (use shm:///path/to.sock)"));
            }
            if !rest.starts_with('/') {
                return Err(bad(
                    "shm:// needs an absolute socket path (shm:///run/x.sock)",
                ));
            }
            return Ok(FabricUri::Shm(PathBuf::from(rest)));
        }
        if let Some(rest) = uri.strip_prefix("rdma://") {
            let hostport = rest.trim_end_matches('/');
            let (host, port) = match hostport.strip_prefix('[') {
                Some(v6) => {
                    let (host, after) = v6
                        .split_once(']')
                        .ok_or_else(|| bad("unclosed '[' in an IPv6 host"))?;
                    let port = after
                        .strip_prefix(':')
                        .ok_or_else(|| bad("expected rdma://[ipv6]:port"))?;
                    (host, port)
                }
                None => {
                    let (host, port) = hostport
                        .rsplit_once(':')
                        .ok_or_else(|| bad("expected rdma://host:port"))?;
                    if host.contains(':') {
                        return Err(bad("an IPv6 host goes in brackets: rdma://[::1]:port"));
                    }
                    (host, port)
                }
            };
            let port: u16 = port
                .parse()
                .map_err(|_| bad("the port must be a number below 65536"))?;
            if host.is_empty() {
                return Err(bad("missing host (rdma://host:port)"));
            }
            return Ok(FabricUri::Rdma {
                host: host.to_string(),
                port,
            });
        }
        Err(bad("scheme must be shm:// or rdma://"))
    }

    /// Resolves the host of an `rdma://` URI (blocking: the system
    /// resolver); an `shm://` URI needs nothing.
    ///
    /// # Errors
    /// [`Error::InvalidUri`] for a host that does not resolve.
    pub fn resolve(&self) -> Result<FabricAddr> {
        match self {
            FabricUri::Shm(p) => Ok(FabricAddr::Shm(p.clone())),
            FabricUri::Rdma { host, port } => {
                let bad = |reason: String| Error::InvalidUri {
                    uri: self.to_string(),
                    reason,
                };
                let addr = (host.as_str(), *port)
                    .to_socket_addrs()
                    .map_err(|e| bad(format!("cannot resolve {host:?}: {e}")))?
                    .next()
                    .ok_or_else(|| bad(format!("{host:?} resolves to no address")))?;
                Ok(FabricAddr::Rdma(addr))
            }
        }
    }
}

impl fmt::Display for FabricUri {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FabricUri::Shm(p) => write!(f, "shm://{}", p.display()),
            FabricUri::Rdma { host, port } if host.contains(':') => {
                write!(f, "rdma://[{host}]:{port}")
            }
            FabricUri::Rdma { host, port } => write!(f, "rdma://{host}:{port}"),
        }
    }
}

impl fmt::Display for FabricAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FabricAddr::Shm(p) => write!(f, "shm://{}", p.display()),
            FabricAddr::Rdma(a) => write!(f, "rdma://{a}"),
        }
    }
}

impl std::str::FromStr for FabricAddr {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        FabricAddr::parse(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_schemes() {
        assert_eq!(
            FabricAddr::parse("shm:///tmp/a.sock").unwrap(),
            FabricAddr::Shm("/tmp/a.sock".into())
        );
        assert_eq!(
            FabricAddr::parse("rdma://127.0.0.1:50051").unwrap(),
            FabricAddr::Rdma("127.0.0.1:50051".parse().unwrap())
        );
        assert!(matches!(
            FabricAddr::parse("http://x"),
            Err(Error::InvalidUri { .. })
        ));
        assert!(matches!(
            FabricAddr::parse("shm://"),
            Err(Error::InvalidUri { .. })
        ));
        assert_eq!(
            FabricAddr::parse("shm:///x").unwrap().to_string(),
            "shm:///x"
        );
    }

    #[test]
    fn one_grammar_for_shm_and_rdma() {
        let bad = |u: &str| matches!(FabricUri::parse(u), Err(Error::InvalidUri { .. }));
        assert!(bad("shm://relative.sock"), "relative shm paths are refused");
        assert!(bad("rdma://host"), "a port is required");
        assert!(bad("rdma://:5"), "a host is required");
        assert!(bad("rdma://h:70000"), "ports fit in 16 bits");
        assert!(bad("rdma://::1:5"), "IPv6 hosts need brackets");
        assert!(bad("rdma://[::1:5"), "brackets close");
        let e = FabricUri::parse("rdma://[::1]").unwrap_err().to_string();
        assert!(e.contains("expected rdma://[ipv6]:port"), "{e}");
        assert_eq!(
            FabricUri::parse("rdma://node7.example:50051/").unwrap(),
            FabricUri::Rdma {
                host: "node7.example".into(),
                port: 50051
            },
            "names stay unresolved until resolve()"
        );
        let v6 = FabricUri::parse("rdma://[::1]:9").unwrap();
        assert_eq!(v6.to_string(), "rdma://[::1]:9");
        assert_eq!(
            v6.resolve().unwrap(),
            FabricAddr::Rdma("[::1]:9".parse().unwrap())
        );
    }
}
