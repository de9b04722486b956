use std::time::Duration;

use proptest::prelude::*;
use rrpc_ringbuf::RingConfig;

use super::*;

/// The message of `b`'s refusal, which must be `InvalidConfig`.
fn refusal(b: RrpcConfigBuilder) -> &'static str {
    match b.build() {
        Err(crate::Error::InvalidConfig(m)) => m,
        other => panic!("expected InvalidConfig, got {other:?}"),
    }
}

const YEAR: Duration = Duration::from_secs(365 * 86_400);

/// `build` refuses a value outside each setting's rule with a message
/// naming the setting, and accepts the edges of every range.
#[test]
fn build_checks_every_validated_setting() {
    let b = RrpcConfig::builder;
    let qp = |depth: u32| {
        rrpc_core::QpConfig::builder()
            .send_depth(depth)
            .build()
            .unwrap()
    };
    let refused: Vec<(&str, RrpcConfigBuilder)> = vec![
        ("max_message_size must be > 0", b().max_message_size(0)),
        // The example: not a power of two, yet it used to build.
        ("ring_size must be a power of two", b().ring_size(5000)),
        ("ring_size must be a power of two", b().ring_size(3 << 20)),
        ("ring_size must be a power of two", b().ring_size(64)),
        ("ring_size must be a power of two", b().ring_size(0)),
        ("ring_size must be a power of two", b().ring_size(2 << 30)),
        (
            "min_ring_size must be a power of two",
            b().min_ring_size(96 << 10),
        ),
        (
            "min_ring_size must be a power of two",
            b().ring_size(128).min_ring_size(64),
        ),
        (
            "min_ring_size must be a power of two",
            b().min_ring_size(8 << 20),
        ),
        // 4 MiB / 16 KiB = 256 > 128: the ring would clamp it no more.
        (
            "min_ring_size must be a power of two",
            b().min_ring_size(16 << 10),
        ),
        (
            "ring_cache_size must be a power of two",
            b().ring_cache_size(3 << 12),
        ),
        (
            "ring_cache_size must be a power of two",
            b().ring_cache_size(32 << 10),
        ),
        (
            "ring_cache_size must be a power of two",
            b().ring_cache_size(8 << 20),
        ),
        (
            "ring_shrink_after must be within 1 ms ..= 365 days",
            b().ring_shrink_after(Duration::from_micros(999)),
        ),
        (
            "ring_idle_size must be a power of two",
            b().ring_idle_size(3 << 10),
        ),
        (
            "ring_idle_size must be a power of two",
            b().ring_idle_size(64),
        ),
        // Above the (default, 64 KiB) minimum.
        (
            "ring_idle_size must be a power of two",
            b().ring_idle_size(128 << 10),
        ),
        (
            "ring_shrink_after must be within 1 ms ..= 365 days",
            b().ring_shrink_after(YEAR + Duration::from_nanos(1)),
        ),
        ("fabrics must allow at least one fabric", b().fabrics([])),
        ("max_chunk must be > 0", b().max_chunk(0)),
        (
            "call_window must be between",
            b().call_window(crate::frame::MIN_CALL_WINDOW - 1),
        ),
        (
            "call_window must be between",
            b().call_window(crate::frame::MAX_WINDOW + 1),
        ),
        (
            "max_header_list_size must be > 0",
            b().max_header_list_size(0),
        ),
        (
            "max_concurrent_calls must be > 0",
            b().max_concurrent_calls(0),
        ),
        (
            "handshake_timeout must be > 0",
            b().handshake_timeout(Duration::ZERO),
        ),
        (
            "max_pending_handshakes must be within 1..=",
            b().max_pending_handshakes(0),
        ),
        (
            "max_pending_handshakes must be within 1..=",
            b().max_pending_handshakes(tokio::sync::Semaphore::MAX_PERMITS + 1),
        ),
        ("max_connections must be > 0", b().max_connections(0)),
        (
            "max_connections_per_peer must be within 1..=max_connections",
            b().max_connections_per_peer(0),
        ),
        (
            "max_connections_per_peer must be within 1..=max_connections",
            b().max_connections(4).max_connections_per_peer(5),
        ),
        ("token must be 1..=256 bytes", b().token(Vec::new())),
        ("token must be 1..=256 bytes", b().token(vec![1u8; 257])),
        ("rdma_device must not be empty", b().rdma_device("")),
        ("rdma_port must be at least 1", b().rdma_port(0)),
        (
            "connection_pool must be at most 1024",
            b().connection_pool(1025),
        ),
        (
            "queue_pair's send_depth must be at least 770",
            b().queue_pair(qp(769)),
        ),
        (
            "peer_lease must be above zero",
            b().peer_lease(Duration::ZERO),
        ),
        (
            "peer_lease must be above zero and at most 365 days",
            b().peer_lease(YEAR + Duration::from_nanos(1)),
        ),
        (
            "max_shared_peers must be at least 1",
            b().max_shared_peers(0),
        ),
        (
            "spare_connections must be at most 16",
            b().spare_connections(MAX_SPARE_CONNECTIONS + 1),
        ),
    ];
    // Sealing needs the keys TLS exports: without the feature, refused.
    #[cfg(not(feature = "tls"))]
    let refused = refused.into_iter().chain([(
        security::NEEDS_TLS_FEATURE,
        b().ring_encryption(RingEncryption::Remote),
    )]);
    for (want, builder) in refused {
        let m = refusal(builder);
        assert!(m.contains(want), "{m:?} does not say {want:?}");
    }
    // The lower edge of every range.
    let low = b()
        .max_message_size(1)
        .ring_size(128)
        .min_ring_size(128)
        .ring_shrink_after(Duration::from_millis(1))
        .ring_idle_size(128)
        .ring_cache_size(128)
        .fabrics([Fabric::Tcp])
        .max_chunk(1)
        .call_window(crate::frame::MIN_CALL_WINDOW)
        .max_header_list_size(1)
        .max_concurrent_calls(1)
        .handshake_timeout(Duration::from_nanos(1))
        .max_pending_handshakes(1)
        .max_connections(1)
        .max_connections_per_peer(1)
        .token(vec![1u8; 1])
        .rdma_device("x")
        .rdma_port(1)
        .connection_pool(0)
        .queue_pair(qp(770))
        .peer_lease(Duration::from_nanos(1))
        .max_shared_peers(1)
        .spare_connections(0)
        .build()
        .expect("the lower edges of every range are allowed");
    assert_eq!(low.fabrics(), vec![Fabric::Tcp]);
    assert_eq!(low.min_ring_size(), 128);
    assert_eq!(low.to_builder().build().unwrap(), low);
    // The upper edge of every range.
    let high = b()
        .ring_size(1 << 30)
        .min_ring_size((1 << 30) / 128)
        .ring_shrink_after(YEAR)
        .ring_idle_size((1 << 30) / 128)
        .ring_cache_size(1 << 30)
        .call_window(crate::frame::MAX_WINDOW)
        .max_pending_handshakes(tokio::sync::Semaphore::MAX_PERMITS)
        .max_connections(7)
        .max_connections_per_peer(7)
        .token(vec![1u8; 256])
        .connection_pool(1024)
        .queue_pair(qp(65536))
        .peer_lease(YEAR)
        .spare_connections(MAX_SPARE_CONNECTIONS)
        .build()
        .expect("the upper edges of every range are allowed");
    assert_eq!(high.min_ring_size(), 8 << 20);
    assert_eq!(high.ring_idle_size(), 8 << 20);
    assert_eq!(low.ring_idle_size(), 128);
    // The default idle size: one page, fitted to the minimum.
    assert_eq!(RrpcConfig::default().ring_idle_size(), 4096);
    let tiny = b().ring_size(1024).build().unwrap();
    assert_eq!((tiny.min_ring_size(), tiny.ring_idle_size()), (1024, 1024));
    assert_eq!(
        RrpcConfig::default()
            .0
            .rings
            .ring_config()
            .build()
            .unwrap()
            .idle_ring_size(),
        4096,
        "the ring a connection builds"
    );
    assert_eq!(b().build().unwrap(), RrpcConfig::default());
    RrpcConfig::default()
        .0
        .validate()
        .expect("the defaults are valid");
}

/// The numbers the rules' messages spell out are the ring's and the
/// handshake's constants.
#[test]
fn rule_messages_match_the_constants() {
    let slot = RingConfig::default().slot_size();
    let smallest = rrpc_ringbuf::MIN_SLOT_COUNT as usize * slot;
    assert_eq!((slot, smallest), (64, 128), "{}", rings::RING_SIZE_RULE);
    assert_eq!(rrpc_ringbuf::MAX_RING_SIZE, 1 << 30);
    assert_eq!(rrpc_ringbuf::MAX_SIZE_RATIO, 128);
    assert_eq!(rrpc_core::handshake::MAX_TOKEN, 256);
    assert_eq!(
        RingConfig::default().send_queue_need(),
        770,
        "{QUEUE_PAIR_RULE}"
    );
    assert!(rings::MIN_RING_SIZE_RULE.contains("ring_size / 128"));
    for rule in [
        rings::RING_SIZE_RULE,
        rings::MIN_RING_SIZE_RULE,
        rings::RING_CACHE_SIZE_RULE,
        rings::RING_SHRINK_AFTER_RULE,
        rings::RING_IDLE_SIZE_RULE,
    ] {
        assert!(rule.contains("must be"), "{rule}");
    }
}

/// A default that fits: any ring size the ring takes builds alone, its
/// minimum fitted into `ring_size / 128 ..= ring_size`.
#[test]
fn the_default_min_ring_size_fits_any_ring_size() {
    let min = |ring: usize| {
        RrpcConfig::builder()
            .ring_size(ring)
            .build()
            .unwrap()
            .min_ring_size()
    };
    assert_eq!(min(128), 128);
    assert_eq!(min(4 << 20), 64 << 10);
    assert_eq!(min(16 << 20), 128 << 10);
    assert_eq!(min(1 << 30), 8 << 20);
}

/// Ring sizes worth trying: powers of two and their neighbours, small
/// values, anything.
fn sizes() -> impl Strategy<Value = usize> {
    let pow = (0u32..usize::BITS).prop_map(|e| 1usize << e);
    prop_oneof![
        pow.clone(),
        (pow, -2isize..=2).prop_map(|(p, d)| p.wrapping_add_signed(d)),
        0usize..(1 << 20),
        any::<usize>(),
    ]
}

proptest! {
    /// `build` takes exactly the ring sizes the ring's own config takes,
    /// and the ring config a connection builds from a config that built
    /// is valid.
    #[test]
    fn ring_size_is_the_rings_rule(ring in sizes()) {
        let ring_takes = RingConfig::builder().ring_size(ring).build().is_ok();
        let built = RrpcConfig::builder().ring_size(ring).build();
        prop_assert_eq!(built.is_ok(), ring_takes, "ring_size {}: {:?}", ring, built);
        if let Ok(cfg) = built {
            prop_assert!(crate::conn::rings::ring_config_for_tests(&cfg).is_ok());
        } else {
            prop_assert_eq!(refusal(RrpcConfig::builder().ring_size(ring)), rings::RING_SIZE_RULE);
        }
    }

    /// A `min_ring_size` set is taken exactly when the ring takes it with
    /// that `ring_size`: never clamped.
    #[test]
    fn min_ring_size_is_the_rings_rule(e in 7u32..=30, min in sizes()) {
        let ring = 1usize << e;
        let ring_takes = RingConfig::builder()
            .ring_size(ring)
            .min_ring_size(min)
            .build()
            .is_ok();
        let built = RrpcConfig::builder().ring_size(ring).min_ring_size(min).build();
        prop_assert_eq!(built.is_ok(), ring_takes, "ring {} min {}: {:?}", ring, min, built);
        if let Ok(cfg) = built {
            prop_assert_eq!(cfg.min_ring_size(), min);
            prop_assert!(crate::conn::rings::ring_config_for_tests(&cfg).is_ok());
        }
    }

    /// A `ring_cache_size` set is taken exactly when it is a power of two
    /// the ring would use as it is (not clamped).
    #[test]
    fn ring_cache_size_is_used_as_set(e in 7u32..=30, cap in sizes()) {
        let ring = 1usize << e;
        let built = RrpcConfig::builder().ring_size(ring).ring_cache_size(cap).build();
        let min = RrpcConfig::builder().ring_size(ring).build().unwrap().min_ring_size();
        let used = RingConfig::builder()
            .ring_size(ring)
            .min_ring_size(min)
            .cache_ring_size(cap)
            .build()
            .map(|r| r.cache_ring_size());
        prop_assert_eq!(built.is_ok(), used.as_ref().ok() == Some(&cap), "ring {} cap {}", ring, cap);
    }
}

/// Every setting by name, from a destructuring of every group that names
/// each field (no `..`): a new field does not compile until it is listed
/// here, and then [`equality_sees_every_setting`] wants a case for it.
fn setting_names(c: &RrpcConfig) -> Vec<&'static str> {
    let Inner {
        rings,
        fast_path,
        polling,
        admission,
        device,
        sharing,
        security,
        fabrics: FabricSet(_),
    } = &*c.0;
    let RingSettings {
        max_message_size: _,
        ring_size: _,
        min_ring_size: _,
        ring_shrink_after: _,
        ring_idle_size: _,
        ring_cache_size: _,
        numa_node: _,
    } = rings;
    let FastPathSettings {
        path: _,
        zero_copy: _,
        max_chunk: _,
        call_window: _,
        max_header_list_size: _,
        max_concurrent_calls: _,
    } = fast_path;
    let PollingSettings {
        poller: _,
        receive_spin: _,
    } = polling;
    let AdmissionSettings {
        handshake_timeout: _,
        max_pending_handshakes: _,
        max_connections: _,
        max_connections_per_peer: _,
        token: _,
        #[cfg(feature = "verbs")]
            tls: admission::TlsSettings {
            server: _,
            client: _,
        },
    } = admission;
    let DeviceSettings {
        rdma_device: _,
        rdma_port: _,
        rdma_gid_index: _,
        queue_pair: _,
        connection_pool: _,
        connection_pool_memory: _,
    } = device;
    let SharingSettings {
        spare_connections: _,
        shared_queue_pairs: _,
        peer_lease: _,
        max_shared_peers: _,
    } = sharing;
    let SecuritySettings { ring_encryption: _ } = security;
    let mut names = vec![
        "max_message_size",
        "ring_size",
        "min_ring_size",
        "ring_shrink_after",
        "ring_idle_size",
        "ring_cache_size",
        "numa_node",
        "path",
        "zero_copy",
        "max_chunk",
        "call_window",
        "max_header_list_size",
        "max_concurrent_calls",
        "poller",
        "receive_spin",
        "handshake_timeout",
        "max_pending_handshakes",
        "max_connections",
        "max_connections_per_peer",
        "token",
        "rdma_device",
        "rdma_port",
        "rdma_gid_index",
        "queue_pair",
        "connection_pool",
        "connection_pool_memory",
        "spare_connections",
        "shared_queue_pairs",
        "peer_lease",
        "max_shared_peers",
        "fabrics",
    ];
    if cfg!(feature = "verbs") {
        names.extend(["tls_server", "tls_client"]);
    }
    // Without `tls` no other value builds (`build_checks_every_validated_setting`).
    if cfg!(feature = "tls") {
        names.push("ring_encryption");
    }
    names
}

/// A server TLS config that has no certificate (never used to serve).
#[cfg(feature = "verbs")]
fn tls_server_config() -> Arc<rrpc_core::rustls::ServerConfig> {
    use rrpc_core::rustls;
    #[derive(Debug)]
    struct NoCert;
    impl rustls::server::ResolvesServerCert for NoCert {
        fn resolve(
            &self,
            _: rustls::server::ClientHello<'_>,
        ) -> Option<Arc<rustls::sign::CertifiedKey>> {
            None
        }
    }
    let _ = rustls::crypto::ring::default_provider().install_default();
    Arc::new(
        rustls::ServerConfig::builder()
            .with_no_client_auth()
            .with_cert_resolver(Arc::new(NoCert)),
    )
}

/// A client TLS config that trusts nothing (never used to connect).
#[cfg(feature = "verbs")]
fn tls_client_config() -> Arc<rrpc_core::rustls::ClientConfig> {
    let _ = rrpc_core::rustls::crypto::ring::default_provider().install_default();
    let roots = Arc::new(rrpc_core::rustls::RootCertStore::empty());
    Arc::new(
        rrpc_core::rustls::ClientConfig::builder()
            .with_root_certificates(roots)
            .with_no_client_auth(),
    )
}

/// Equality sees every setting: each setter makes a config unequal to
/// the defaults and to every other one-setting change, and a clone (or
/// the same settings built again) is equal; every setting has a case.
#[test]
fn equality_sees_every_setting() {
    let d = RrpcConfig::default();
    assert_eq!(d, d.clone());
    assert_eq!(d, RrpcConfig::default());
    let qp = rrpc_core::QpConfig::default();
    let with = |f: fn(RrpcConfigBuilder) -> RrpcConfigBuilder| f(d.to_builder()).build().unwrap();
    #[allow(unused_mut)]
    let mut changed: Vec<(&str, RrpcConfig)> = vec![
        ("max_message_size", with(|b| b.max_message_size(1 << 10))),
        ("ring_size", with(|b| b.ring_size(1 << 16))),
        ("min_ring_size", with(|b| b.min_ring_size(1 << 17))),
        (
            "ring_shrink_after",
            with(|b| b.ring_shrink_after(Duration::from_secs(2))),
        ),
        ("ring_idle_size", with(|b| b.ring_idle_size(8 << 10))),
        (
            "numa_node",
            with(|b| b.numa_node(rrpc_core::numa::NumaPlacement::Off)),
        ),
        ("ring_cache_size", with(|b| b.ring_cache_size(1 << 17))),
        ("path", with(|b| b.path(PathPreference::Http2))),
        ("zero_copy", with(|b| b.zero_copy(false))),
        ("max_chunk", with(|b| b.max_chunk(1 << 10))),
        ("call_window", with(|b| b.call_window(1 << 12))),
        (
            "max_header_list_size",
            with(|b| b.max_header_list_size(1 << 10)),
        ),
        ("max_concurrent_calls", with(|b| b.max_concurrent_calls(7))),
        ("poller", with(|b| b.poller(default_poller_config()))),
        (
            "receive_spin",
            with(|b| b.receive_spin(Duration::from_micros(3))),
        ),
        (
            "handshake_timeout",
            with(|b| b.handshake_timeout(Duration::from_secs(1))),
        ),
        (
            "max_pending_handshakes",
            with(|b| b.max_pending_handshakes(3)),
        ),
        ("max_connections", with(|b| b.max_connections(300))),
        (
            "max_connections_per_peer",
            with(|b| b.max_connections_per_peer(9)),
        ),
        ("token", with(|b| b.token("secret"))),
        ("rdma_device", with(|b| b.rdma_device("rxe0"))),
        ("rdma_port", with(|b| b.rdma_port(2))),
        ("rdma_gid_index", with(|b| b.rdma_gid_index(1))),
        (
            "queue_pair",
            d.to_builder()
                .queue_pair(qp.to_builder().recv_depth(3).build().unwrap())
                .build()
                .unwrap(),
        ),
        (
            "rc_retry",
            with(|b| {
                b.rc_retry(
                    rrpc_core::RcRetry::builder()
                        .retry_count(1)
                        .build()
                        .unwrap(),
                )
            }),
        ),
        ("connection_pool", with(|b| b.connection_pool(3))),
        (
            "connection_pool_memory",
            with(|b| b.connection_pool_memory(1 << 20)),
        ),
        ("shared_queue_pairs", with(|b| b.shared_queue_pairs(true))),
        ("peer_lease", with(|b| b.peer_lease(Duration::from_secs(1)))),
        ("max_shared_peers", with(|b| b.max_shared_peers(3))),
        ("spare_connections", with(|b| b.spare_connections(2))),
        ("fabrics", with(|b| b.fabrics([Fabric::Shm]))),
    ];
    #[cfg(feature = "tls")]
    changed.push((
        "ring_encryption",
        with(|b| b.ring_encryption(RingEncryption::Required)),
    ));
    #[cfg(feature = "verbs")]
    {
        let name = rrpc_core::rustls::pki_types::ServerName::try_from("a.test").unwrap();
        changed.push((
            "tls_server",
            d.to_builder()
                .tls_server(tls_server_config())
                .build()
                .unwrap(),
        ));
        changed.push((
            "tls_client",
            d.to_builder()
                .tls_client(tls_client_config(), name)
                .build()
                .unwrap(),
        ));
    }
    for name in setting_names(&d) {
        assert!(
            changed.iter().any(|(n, _)| *n == name),
            "{name} has no case here"
        );
    }
    for (i, (name, c)) in changed.iter().enumerate() {
        assert_ne!(*c, d, "{name} is not compared");
        assert_eq!(*c, c.clone(), "{name}");
        for (other, o) in &changed[i + 1..] {
            assert_ne!(c, o, "{name} and {other} compare equal");
        }
    }
    // A poller setting equal to the default poller is still a setting.
    assert_ne!(with(|b| b.poller(default_poller_config())), d);
    // The same token built twice is the same setting.
    assert_eq!(
        with(|b| b.token("secret")),
        RrpcConfig::builder().token("secret").build().unwrap()
    );
}

/// Two configs ask for the same runtime resources exactly when their
/// poller, NUMA placement, device group and peer cache settings agree.
#[test]
fn same_resources_follows_the_resource_settings() {
    let d = RrpcConfig::default();
    let same = |c: RrpcConfig| d.same_resources(&c);
    assert!(same(d.clone()));
    assert!(same(d.to_builder().ring_size(1 << 20).build().unwrap()));
    assert!(same(d.to_builder().token("t").build().unwrap()));
    assert!(!same(d.to_builder().rdma_port(2).build().unwrap()));
    assert!(!same(d.to_builder().connection_pool(1).build().unwrap()));
    assert!(!same(
        d.to_builder()
            .peer_lease(Duration::from_secs(1))
            .build()
            .unwrap()
    ));
    assert!(!same(
        d.to_builder()
            .numa_node(rrpc_core::numa::NumaPlacement::Off)
            .build()
            .unwrap()
    ));
}

#[test]
fn rdma_port_and_gid_index_are_kept() {
    let c = RrpcConfig::default();
    assert_eq!((c.rdma_port(), c.rdma_gid_index()), (None, None));
    let c = c
        .to_builder()
        .rdma_device("rxe0")
        .rdma_port(2)
        .rdma_gid_index(3)
        .build()
        .unwrap();
    assert_eq!(c.rdma_device(), Some("rxe0"));
    assert_eq!((c.rdma_port(), c.rdma_gid_index()), (Some(2), Some(3)));
}

#[cfg(feature = "verbs")]
#[test]
fn tls_configs_compare_by_identity() {
    let client = tls_client_config();
    let name = rrpc_core::rustls::pki_types::ServerName::try_from("a.test").unwrap();
    let a = RrpcConfig::builder()
        .tls_client(client.clone(), name.clone())
        .build()
        .unwrap();
    assert_eq!(
        a,
        RrpcConfig::builder()
            .tls_client(client.clone(), name.clone())
            .build()
            .unwrap()
    );
    assert_ne!(a, RrpcConfig::default());
    let other = Arc::new((*client).clone());
    assert_ne!(
        a,
        RrpcConfig::builder()
            .tls_client(other, name)
            .build()
            .unwrap()
    );
    let b = rrpc_core::rustls::pki_types::ServerName::try_from("b.test").unwrap();
    assert_ne!(
        a,
        RrpcConfig::builder().tls_client(client, b).build().unwrap()
    );
    let server = tls_server_config();
    let s = RrpcConfig::builder()
        .tls_server(server.clone())
        .build()
        .unwrap();
    assert_eq!(s, RrpcConfig::builder().tls_server(server).build().unwrap());
    assert_ne!(
        s,
        RrpcConfig::builder()
            .tls_server(tls_server_config())
            .build()
            .unwrap()
    );
}

#[cfg(feature = "verbs")]
#[test]
fn verbs_options_follow_the_config() {
    let o = RrpcConfig::default().verbs_options();
    assert_eq!(o, rrpc_core::VerbsOptions::default());
    let o = RrpcConfig::builder()
        .rdma_device("mlx5_1")
        .rdma_port(2)
        .rdma_gid_index(3)
        .build()
        .unwrap()
        .verbs_options();
    assert_eq!(o.device(), Some("mlx5_1"));
    assert_eq!(o.port(), 2);
    assert_eq!(o.gid_index(), Some(3));
}
