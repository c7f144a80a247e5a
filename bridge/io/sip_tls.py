"""TLS for the SIP leg: the listener's server context and the contexts we call out with.

Only the standard library's ``ssl``. The listener's certificate chain and key
come from ``[sip] tls_certificate_file`` / ``tls_key_file`` (read once at
start; systemd ``LoadCredential=`` paths through ``$CREDENTIALS_DIRECTORY``).
Peers we call are verified by default, against the system's store or
``[sip] tls_ca_file``, with the host name checked (SNI sent for a name); a
host in ``[sip] tls_unverified_hosts`` is called without verification, and
only that host. TLS 1.2 is the floor either way.
"""

from __future__ import annotations

import ssl

from bridge.io.startup import EXIT_CONFIG, StartupError
from bridge.sip.settings import SipSecurity

__all__ = ["ClientContexts", "server_context"]

HANDSHAKE_TIMEOUT_S = 10.0
"""A TLS handshake not finished in this long is abandoned (either direction)."""


def server_context(certificate_file: str, key_file: str) -> ssl.SSLContext:
    """The listener's context (no client certificate asked for).

    Raises:
        StartupError: the files are not a certificate chain and its key (the message
            names ``sip.tls_certificate_file``; never the key's bytes).
    """
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(certificate_file, key_file)
    except (ssl.SSLError, OSError) as exc:
        reason = getattr(exc, "reason", None) or getattr(exc, "strerror", None) or type(exc)
        raise StartupError(
            f"sip.tls_certificate_file: {certificate_file!r} with sip.tls_key_file "
            f"{key_file!r}: not a certificate chain and its private key ({reason})",
            EXIT_CONFIG,
        ) from None
    return context


class ClientContexts:
    """The contexts outbound TLS connections use: verifying, or for an opted-out host not."""

    def __init__(self, security: SipSecurity) -> None:
        try:
            self.verifying = ssl.create_default_context(cafile=security.ca_file or None)
        except (ssl.SSLError, OSError) as exc:
            raise StartupError(
                f"sip.tls_ca_file: {security.ca_file!r}: not a CA bundle ({exc})", EXIT_CONFIG
            ) from None
        self.verifying.minimum_version = ssl.TLSVersion.TLSv1_2
        self.unverified = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        self.unverified.minimum_version = ssl.TLSVersion.TLSv1_2
        self.unverified.check_hostname = False
        self.unverified.verify_mode = ssl.CERT_NONE
        self.unverified_hosts = frozenset(h.lower() for h in security.unverified_hosts)

    def for_host(self, host: str) -> ssl.SSLContext:
        """The context to call ``host`` with (the name or address the target named)."""
        if host.lower().strip("[]") in self.unverified_hosts:
            return self.unverified
        return self.verifying
