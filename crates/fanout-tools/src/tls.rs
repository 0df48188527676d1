//! TLS for the load clients: trust the certificates of one PEM file (a relay's
//! `--self-signed` certificate, say).

use rustls::pki_types::{pem::PemObject, CertificateDer};
use std::path::Path;
use std::sync::Arc;

pub fn trusting(path: &Path) -> anyhow::Result<Arc<rustls::ClientConfig>> {
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(path).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))? {
        roots.add(c.map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?)?;
    }
    anyhow::ensure!(!roots.is_empty(), "{}: no CERTIFICATE in the file", path.display());
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    Ok(Arc::new(
        rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .with_root_certificates(roots)
            .with_no_client_auth(),
    ))
}
