//! Helpers for tests of code built on rrpc-core (feature `test-util`). Not for
//! production: nothing here is hardened or kept stable.

/// A side-channel TLS pair for tests (feature `verbs`): a server config with a
/// fresh self-signed certificate for `name`, and a client config that trusts
/// it and nothing else. Two calls make two certificates that do not trust
/// each other.
///
/// # Panics
/// If rcgen or rustls refuse the generated certificate (they do not).
#[cfg(feature = "verbs")]
pub fn self_signed_tls(
    name: &str,
) -> (
    std::sync::Arc<rustls::ServerConfig>,
    std::sync::Arc<rustls::ClientConfig>,
) {
    use std::sync::Arc;
    let ck = rcgen::generate_simple_self_signed(vec![name.to_string()])
        .expect("a self-signed certificate");
    let cert = ck.cert.der().clone();
    let key = rustls::pki_types::PrivateKeyDer::Pkcs8(ck.signing_key.serialize_der().into());
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let server = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .expect("the ring provider's protocol versions")
        .with_no_client_auth()
        .with_single_cert(vec![cert.clone()], key)
        .expect("the certificate and its key");
    let mut roots = rustls::RootCertStore::empty();
    roots.add(cert).expect("the certificate as a root");
    let client = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("the ring provider's protocol versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    (Arc::new(server), Arc::new(client))
}
