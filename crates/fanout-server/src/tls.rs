//! TLS for the API, HTTP streams and RTSPS (issue 15), with rustls (no OpenSSL, TLS 1.2
//! and 1.3 only, ring's ciphers). The certificate lives behind a resolver that `SIGHUP`
//! swaps (`Tls::reload`): connections already open keep the key they shook hands with, new
//! ones get the new pair, and a pair that does not load leaves the old one in place.

use parking_lot::RwLock;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Where the pair comes from.
#[derive(Debug, Clone)]
pub enum Source {
    Files {
        cert: PathBuf,
        key: PathBuf,
    },
    /// Made at start (`fanout serve --self-signed`), written to `cert` for clients to trust.
    SelfSigned {
        cert: PathBuf,
    },
}

#[derive(Debug)]
struct Resolver(RwLock<Arc<CertifiedKey>>);

impl ResolvesServerCert for Resolver {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.0.read().clone())
    }
}

pub struct Tls {
    source: Source,
    resolver: Arc<Resolver>,
    acceptor: tokio_rustls::TlsAcceptor,
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The SHA-256 fingerprint of a certificate, as browsers and `openssl x509 -fingerprint`
/// show it (`AB:CD:…`).
pub fn fingerprint(der: &[u8]) -> String {
    let d = ring::digest::digest(&ring::digest::SHA256, der);
    d.as_ref().iter().map(|b| format!("{b:02X}")).collect::<Vec<_>>().join(":")
}

/// Loads a PEM certificate chain and its private key, checking that they belong together.
pub fn load(cert: &Path, key: &Path) -> anyhow::Result<CertifiedKey> {
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .map_err(|e| anyhow::anyhow!("TLS certificate {}: {e}", cert.display()))?
        .collect::<Result<_, _>>()
        .map_err(|e| anyhow::anyhow!("TLS certificate {}: {e}", cert.display()))?;
    anyhow::ensure!(!chain.is_empty(), "TLS certificate {}: no CERTIFICATE in the file", cert.display());
    let der = PrivateKeyDer::from_pem_file(key).map_err(|e| anyhow::anyhow!("TLS key {}: {e}", key.display()))?;
    CertifiedKey::from_der(chain, der, &provider()).map_err(|e| {
        anyhow::anyhow!("TLS certificate {} and key {} do not make a pair: {e}", cert.display(), key.display())
    })
}

/// A self-signed certificate for this host's loopback names and `names`.
fn self_signed(names: &[String]) -> anyhow::Result<(CertifiedKey, String)> {
    let mut alt = vec!["localhost".to_string(), "127.0.0.1".to_string(), "::1".to_string()];
    alt.extend(names.iter().cloned());
    let rcgen::CertifiedKey { cert, signing_key } = rcgen::generate_simple_self_signed(alt)?;
    let key = PrivateKeyDer::try_from(signing_key.serialize_der()).map_err(|e| anyhow::anyhow!("{e}"))?;
    let ck = CertifiedKey::from_der(vec![cert.der().clone()], key, &provider())?;
    Ok((ck, cert.pem()))
}

impl Tls {
    /// Loads the pair (or makes a self-signed one): a bad or mismatched pair is an error
    /// that names the files.
    pub fn new(source: Source, names: &[String]) -> anyhow::Result<Arc<Self>> {
        let key = match &source {
            Source::Files { cert, key } => load(cert, key)?,
            Source::SelfSigned { cert } => {
                let (ck, pem) = self_signed(names)?;
                std::fs::write(cert, pem).map_err(|e| anyhow::anyhow!("writing {}: {e}", cert.display()))?;
                ck
            }
        };
        let resolver = Arc::new(Resolver(RwLock::new(Arc::new(key))));
        let mut cfg = rustls::ServerConfig::builder_with_provider(provider())
            .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])?
            .with_no_client_auth()
            .with_cert_resolver(resolver.clone());
        cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(cfg));
        Ok(Arc::new(Self { source, resolver, acceptor }))
    }

    pub fn acceptor(&self) -> &tokio_rustls::TlsAcceptor {
        &self.acceptor
    }

    /// The served certificate's SHA-256 fingerprint.
    pub fn fingerprint(&self) -> String {
        self.resolver.0.read().end_entity_cert().map(|c| fingerprint(c)).unwrap_or_default()
    }

    /// The file clients can trust (`curl --cacert`), for a self-signed certificate.
    pub fn self_signed_file(&self) -> Option<&Path> {
        match &self.source {
            Source::SelfSigned { cert } => Some(cert),
            Source::Files { .. } => None,
        }
    }

    /// Reads the files again (on SIGHUP). On error the old pair stays.
    pub fn reload(&self) -> anyhow::Result<()> {
        let Source::Files { cert, key } = &self.source else {
            anyhow::bail!("a self-signed certificate is not reloaded");
        };
        let ck = load(cert, key)?;
        *self.resolver.0.write() = Arc::new(ck);
        Ok(())
    }
}

/// Whether the first bytes of a connection are a TLS handshake record (a ClientHello):
/// content type 22, version 3.x.
pub fn looks_like_tls(first: &[u8]) -> bool {
    first.len() >= 2 && first[0] == 0x16 && first[1] == 0x03
}

/// The certificates of a PEM file, as roots to trust.
pub fn roots_from(path: &Path) -> anyhow::Result<rustls::RootCertStore> {
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(path).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))? {
        roots.add(c.map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?)?;
    }
    anyhow::ensure!(!roots.is_empty(), "{}: no CERTIFICATE in the file", path.display());
    Ok(roots)
}

/// How a TLS client checks its server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verify {
    /// The public web roots (Mozilla's, through webpki-roots).
    PublicRoots,
    /// The certificates of a PEM file.
    Ca(PathBuf),
    /// Exactly this certificate: its SHA-256 (32 bytes), whatever signed it.
    Pinned([u8; 32]),
    /// Anything (the handshake's signatures are still checked): said loudly where chosen.
    Off,
}

/// Parses a SHA-256 fingerprint: 64 hex digits, with or without `:` between bytes.
pub fn parse_fingerprint(s: &str) -> Result<[u8; 32], fanout_proto::Invalid> {
    let hex: String = s.chars().filter(|c| *c != ':').collect();
    let bytes: Option<Vec<u8>> =
        (0..hex.len()).step_by(2).map(|i| hex.get(i..i + 2).and_then(|h| u8::from_str_radix(h, 16).ok())).collect();
    bytes.and_then(|b| <[u8; 32]>::try_from(b).ok()).ok_or_else(|| {
        let shown: String = s.chars().take(100).collect();
        fanout_proto::Invalid(format!(
            "{shown:?} is not a SHA-256 fingerprint (64 hex digits, `:` between bytes allowed)"
        ))
    })
}

/// Checks the server by a pinned fingerprint, or not at all, and always the handshake's
/// signatures.
#[derive(Debug)]
struct PinVerifier {
    pin: Option<[u8; 32]>,
    provider: Arc<CryptoProvider>,
}

impl rustls::client::danger::ServerCertVerifier for PinVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _name: &rustls::pki_types::ServerName<'_>,
        _ocsp: &[u8],
        _now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        match self.pin {
            Some(pin) if ring::digest::digest(&ring::digest::SHA256, end_entity).as_ref() != pin => {
                Err(rustls::Error::General(format!(
                    "the certificate's fingerprint {} is not the pinned one",
                    fingerprint(end_entity)
                )))
            }
            _ => Ok(rustls::client::danger::ServerCertVerified::assertion()),
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.provider.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.provider.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.provider.signature_verification_algorithms.supported_schemes()
    }
}

/// How a client of another server checks its certificate: at most one of a CA file, a
/// pinned fingerprint, `verify = false`; the public roots when none.
pub fn verify_of(
    ca: &Option<String>,
    fingerprint: &Option<String>,
    verify: Option<bool>,
) -> Result<Verify, fanout_proto::Invalid> {
    match (ca, fingerprint, verify) {
        (None, None, None | Some(true)) => Ok(Verify::PublicRoots),
        (Some(ca), None, None | Some(true)) => Ok(Verify::Ca(ca.into())),
        (None, Some(f), None | Some(true)) => parse_fingerprint(f)
            .map(Verify::Pinned)
            .map_err(|e| fanout_proto::Invalid(format!("\"tls_fingerprint\": {e}"))),
        (None, None, Some(false)) => Ok(Verify::Off),
        _ => Err("give at most one of \"tls_ca\", \"tls_fingerprint\", \"tls_verify\" = false".into()),
    }
}

/// A TLS client configuration for connecting to another server (an `rtsps://` upstream).
pub fn client_config(verify: &Verify) -> anyhow::Result<Arc<rustls::ClientConfig>> {
    let builder = rustls::ClientConfig::builder_with_provider(provider()).with_safe_default_protocol_versions()?;
    let cfg = match verify {
        Verify::PublicRoots => builder
            .with_root_certificates(rustls::RootCertStore { roots: webpki_roots::TLS_SERVER_ROOTS.to_vec() })
            .with_no_client_auth(),
        Verify::Ca(path) => builder.with_root_certificates(roots_from(path)?).with_no_client_auth(),
        Verify::Pinned(pin) => builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(PinVerifier { pin: Some(*pin), provider: provider() }))
            .with_no_client_auth(),
        Verify::Off => builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(PinVerifier { pin: None, provider: provider() }))
            .with_no_client_auth(),
    };
    Ok(Arc::new(cfg))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fingerprint_is_64_hex_digits_with_or_without_colons() {
        let hex = "ab".repeat(32);
        assert_eq!(parse_fingerprint(&hex).unwrap(), [0xab; 32]);
        let colons = vec!["AB"; 32].join(":");
        assert_eq!(parse_fingerprint(&colons).unwrap(), [0xab; 32]);
        for bad in ["", "ab", &"ab".repeat(31), &"zz".repeat(32), &"ab".repeat(33)] {
            let e = parse_fingerprint(bad).unwrap_err();
            assert!(e.0.contains("is not a SHA-256 fingerprint"), "{bad:?}: {e}");
        }
        assert_eq!(fingerprint(b"x").len(), 32 * 3 - 1, "printed as hex pairs with colons");
    }

    #[test]
    fn a_tls_client_hello_is_told_from_rtsp() {
        assert!(looks_like_tls(&[0x16, 0x03, 0x01, 0x02, 0x00]));
        assert!(!looks_like_tls(b"OPTIONS rtsp://h/x RTSP/1.0\r\n"));
        assert!(!looks_like_tls(b""));
    }
}
