//! Other programs' messages the sandbox layer must recognise by their words: an engine's or a
//! library's error with no code of its own to tell it by. They are matched here and nowhere
//! else, each against the message as that program printed it (the tests below quote it, with
//! the version it came from), so a changed wording fails a test here rather than a user's
//! run.

/// Words of another program's message, matched without regard to case.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Words(&'static str);

impl Words {
    pub(crate) fn in_message(self, message: &str) -> bool {
        message.to_ascii_lowercase().contains(self.0)
    }
}

/// The engine has no runtime of the name `HostConfig.Runtime` gave (the create fails with 400).
pub(crate) const UNKNOWN_RUNTIME: Words = Words("unknown runtime");

/// A plain-HTTP request reached a TLS listener: Go's `net/http` answers it with this text,
/// so a Docker engine that wants TLS says so this way.
pub(crate) const PLAIN_HTTP_TO_TLS: Words = Words("https server");

/// gVisor, registered without `--network=none`, refusing to start on a host like CI's VMs.
pub(crate) const RUNSC_ROOT_NETNS: Words = Words("root network namespace");

/// A connection that failed in TLS rather than in reaching the host: the words of rustls's and
/// hyper's errors (the typed `rustls::Error` is checked first where the chain carries it).
pub(crate) const TLS_FAILURE: [Words; 3] = [Words("certificate"), Words("tls"), Words("handshake")];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_message_is_recognised_as_its_program_printed_it() {
        // Docker Engine 20.10.24 (API 1.41), `docker run --runtime nope`: measured here.
        assert!(UNKNOWN_RUNTIME.in_message("Unknown runtime specified nope"));
        // Go's net/http server (since Go 1.12), as dockerd with --tlsverify answers plain HTTP.
        assert!(PLAIN_HTTP_TO_TLS.in_message("Client sent an HTTP request to an HTTPS server.\n"));
        // Docker 20.10 relaying Debian's runsc (release 2022-12) on a VM.
        assert!(RUNSC_ROOT_NETNS.in_message(
            "OCI runtime start failed: starting container: setting up network: creating \
             interfaces from net namespace \"/proc/16625/ns/net\": cannot run with network \
             enabled in root network namespace: unknown"
        ));
        // rustls 0.23: a CA the client does not trust; the engine refusing the handshake.
        let tls = |m: &str| TLS_FAILURE.iter().any(|w| w.in_message(m));
        assert!(tls("invalid peer certificate: UnknownIssuer"));
        assert!(tls("received fatal alert: HandshakeFailure"));
        // And not what reaching the host fails with.
        assert!(!tls("Connection refused (os error 111)"));
        assert!(!UNKNOWN_RUNTIME.in_message("No such image: agentbox/python:3"));
    }
}
