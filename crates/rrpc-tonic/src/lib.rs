//! tonic over rrpc: transports and builders (to be built: issue 5).
