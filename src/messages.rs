//! Other programs' messages agentbox itself must recognise by their words (a tool's output,
//! with no status of its own to tell the failure by). They are matched here and nowhere else,
//! each tested against the output as that program printed it. The sandbox and model crates
//! keep their own (`agentbox_sandbox::messages`, `agentbox_model::messages`).

/// Whether a tool's output says a TLS certificate was not trusted: pip/Python and OpenSSL,
/// curl/cargo/git, Node, Go.
pub(crate) fn is_certificate_failure(output: &str) -> bool {
    const SIGNS: &[&str] = &[
        "CERTIFICATE_VERIFY_FAILED",
        "certificate verify failed",
        "SSL certificate problem",
        "self-signed certificate in certificate chain",
        "self signed certificate in certificate chain",
        "unable to get local issuer certificate",
        "SELF_SIGNED_CERT_IN_CHAIN",
        "UNABLE_TO_GET_ISSUER_CERT",
        "UNABLE_TO_VERIFY_LEAF_SIGNATURE",
        "x509: certificate signed by unknown authority",
        "tls: failed to verify certificate",
        "server certificate verification failed",
    ];
    SIGNS.iter().any(|s| output.contains(s))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn certificate_failures_are_recognised() {
        // pip in agentbox/python:3 (Python 3.13's ssl, Debian trixie's OpenSSL 3).
        assert!(is_certificate_failure(
            "SSLError(SSLCertVerificationError(1, '[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: self-signed certificate in certificate chain"
        ));
        // cargo in agentbox/rust:1 (its libcurl).
        assert!(is_certificate_failure(
            "[60] SSL peer certificate or SSH remote key was not OK (SSL certificate problem: unable to get local issuer certificate)"
        ));
        assert!(!is_certificate_failure(
            "ERROR: No matching distribution found for x"
        ));
    }
}
