//! The client side: [`RrpcEndpoint`], tonic's `Endpoint` for every rrpc
//! URI, builds an [`RrpcChannel`], which tonic's generated clients call.
//! Its files, bottom up (each imports only those before it):
//!
//! * [`managed`]: the reconnecting ring connection behind a channel, one
//!   connection at a time, on the fast path ([`crate::fast`]'s client) or
//!   the HTTP/2 path ([`crate::h2stream`]);
//! * [`channel`]: [`RrpcChannel`], the `tower::Service` the stubs call;
//! * [`endpoint`]: [`RrpcEndpoint`] and the constructors of
//!   [`RrpcChannel`] that take one (`connect`, `balance_list`).

mod channel;
mod endpoint;
mod managed;

pub use channel::RrpcChannel;
pub use endpoint::RrpcEndpoint;
