//! The TLS example pair, as two processes: `tls-server` with mutual TLS on
//! an `rrpc://` port, `tls-client` with the CA and its certificate lands on
//! shm and its certificate reaches the handler; without a certificate it
//! is refused. Certificates are made here (rcgen).
#![cfg(feature = "tls")]

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Writes a CA, a server certificate for localhost/127.0.0.1 and a client
/// certificate, all PEM, into `dir`.
fn write_pki(dir: &Path) {
    use rcgen::{
        BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose,
        IsCa, Issuer, KeyPair, KeyUsagePurpose,
    };
    let named = |cn: &str| {
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, cn);
        dn
    };
    let ca_key = KeyPair::generate().unwrap();
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.distinguished_name = named("example CA");
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let ca_cert = ca.self_signed(&ca_key).unwrap();
    std::fs::write(dir.join("ca.pem"), ca_cert.pem()).unwrap();
    let issuer = Issuer::new(ca, ca_key);
    for (name, names, usage) in [
        (
            "server",
            vec!["localhost".to_string(), "127.0.0.1".to_string()],
            ExtendedKeyUsagePurpose::ServerAuth,
        ),
        (
            "client",
            vec!["client.example".to_string()],
            ExtendedKeyUsagePurpose::ClientAuth,
        ),
    ] {
        let key = KeyPair::generate().unwrap();
        let mut p = CertificateParams::new(names.clone()).unwrap();
        p.distinguished_name = named(&names[0]);
        p.extended_key_usages = vec![usage];
        let cert = p.signed_by(&key, &issuer).unwrap();
        std::fs::write(dir.join(format!("{name}.pem")), cert.pem()).unwrap();
        std::fs::write(dir.join(format!("{name}.key")), key.serialize_pem()).unwrap();
    }
}

/// Kills the server when the test ends, however it ends.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn the_tls_example_pair_runs_with_mutual_tls_on_one_port() {
    let dir = std::env::temp_dir().join(format!("rrpc-tls-example-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    write_pki(&dir);
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let uri = format!("rrpc://127.0.0.1:{port}");
    let p = |n: &str| dir.join(n);
    let _server = Killed(
        Command::new(env!("CARGO_BIN_EXE_tls-server"))
            .args(["--uri", &uri, "--cert"])
            .arg(p("server.pem"))
            .arg("--key")
            .arg(p("server.key"))
            .arg("--client-ca")
            .arg(p("ca.pem"))
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let client = |with_cert: bool| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_tls-client"));
        c.args(["--uri", &uri, "--ca"]).arg(p("ca.pem"));
        if with_cert {
            c.arg("--cert")
                .arg(p("client.pem"))
                .arg("--key")
                .arg(p("client.key"));
        }
        c.output().unwrap()
    };
    // The server binds after it starts: retry (bounded) until it answers.
    let deadline = Instant::now() + Duration::from_secs(60);
    let out = loop {
        let out = client(true);
        if out.status.success() || Instant::now() > deadline {
            break out;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "tls-client: {out:?}");
    assert!(text.contains("carried by Shm"), "{text}");
    assert!(
        text.contains("your TLS certificate chain: 1 certificate(s)"),
        "the handler saw the client's certificate: {text}"
    );
    // Mutual TLS: a client without a certificate is refused.
    let out = client(false);
    assert!(
        !out.status.success(),
        "a client without a certificate: {out:?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
