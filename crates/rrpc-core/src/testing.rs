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

/// The provider a test runs on: shm always; verbs when built with feature
/// `verbs` and `RRPC_TEST_DEVICE` names a device (`rxe0` in `cargo xtask rxe`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Provider {
    /// Same-host shared memory.
    Shm,
    /// The verbs provider on this device.
    Verbs(String),
}

impl Provider {
    /// The verbs provider on `RRPC_TEST_DEVICE`, or `None` when it is unset
    /// (and the test says, on stderr, that it is skipped).
    pub fn verbs_from_env() -> Option<Provider> {
        let dev = std::env::var("RRPC_TEST_DEVICE")
            .ok()
            .filter(|d| !d.is_empty());
        if dev.is_none() {
            eprintln!("skipped: RRPC_TEST_DEVICE not set");
        }
        dev.map(Provider::Verbs)
    }

    /// Opens the fabric and checks that it is the provider asked for: a
    /// verbs test that silently ran on shm would prove nothing.
    ///
    /// # Panics
    /// If the device does not open, or opens as another provider.
    pub fn fabric(&self) -> crate::Fabric {
        match self {
            Provider::Shm => crate::Fabric::shm(),
            #[cfg(feature = "verbs")]
            Provider::Verbs(dev) => {
                let f = crate::Fabric::verbs(Some(dev)).expect("open the verbs device");
                assert_eq!(f.kind(), crate::ProviderKind::Verbs);
                assert_eq!(
                    f.device_name(),
                    Some(dev.as_str()),
                    "verbs on the named device"
                );
                f
            }
            #[cfg(not(feature = "verbs"))]
            Provider::Verbs(_) => panic!("a verbs test needs feature `verbs`"),
        }
    }

    /// The provider kind a peer reports for this provider.
    pub fn kind(&self) -> crate::ProviderKind {
        match self {
            Provider::Shm => crate::ProviderKind::Shm,
            Provider::Verbs(_) => crate::ProviderKind::Verbs,
        }
    }

    /// Whether this is the verbs provider.
    pub fn is_verbs(&self) -> bool {
        matches!(self, Provider::Verbs(_))
    }

    /// Scales an iteration count down (by 5) for soft-RoCE under an emulated
    /// CPU; never below 1.
    pub fn scaled(&self, n: usize) -> usize {
        match self {
            Provider::Shm => n,
            Provider::Verbs(_) => (n / 5).max(1),
        }
    }

    /// How long a test waits for one completion (TCG-emulated soft-RoCE is
    /// 20-50x slower than a host).
    pub fn patience(&self) -> std::time::Duration {
        match self {
            Provider::Shm => std::time::Duration::from_secs(5),
            Provider::Verbs(_) => std::time::Duration::from_secs(60),
        }
    }
}

/// Runs each named `fn(&Provider)` as a test on shm (module `shm`) and, when
/// the calling crate has feature `verbs`, on `RRPC_TEST_DEVICE` (module
/// `verbs`; skipped, saying so, when it is unset).
#[macro_export]
macro_rules! on_every_provider {
    ($($name:ident),* $(,)?) => {
        mod shm {
            $( #[test] fn $name() { super::$name(&$crate::testing::Provider::Shm); } )*
        }
        #[cfg(feature = "verbs")]
        mod verbs {
            $( #[test] fn $name() {
                if let Some(p) = $crate::testing::Provider::verbs_from_env() { super::$name(&p); }
            } )*
        }
    };
}
