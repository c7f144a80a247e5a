"""Configuration of the SIP engines: frozen dataclasses built by the config loader."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["SRTP_MODES", "SipAuthUser", "SipSecurity", "SipSettings", "TimerSettings"]

SRTP_MODES = ("off", "offer", "require")
"""``srtp`` settings: no SRTP; offered (taken when the peer offers it); required."""


@dataclass(frozen=True, slots=True)
class TimerSettings:
    """RFC 3261 §17 base timer values (Table 4)."""

    t1_s: float = 0.5
    """RTT estimate; A, E and G start here; B, F, H, J, L, M are 64*T1."""
    t2_s: float = 4.0
    """Cap of the retransmit interval for non-INVITE requests and INVITE responses."""
    t4_s: float = 5.0
    """Longest time a message stays in the network (timers I and K)."""

    @property
    def timeout_s(self) -> float:
        """64*T1: timers B, F, H, J (UDP), L and M."""
        return 64 * self.t1_s


@dataclass(frozen=True, slots=True)
class SipAuthUser:
    """One ``[sip.auth]`` account: inbound INVITEs may be challenged for it."""

    username: str
    password: str


@dataclass(frozen=True, slots=True)
class SipSecurity:
    """TLS peer verification and SRTP of the calls placed and taken (today ``[sip]``; a
    trunk will carry its own). SDES keys travel only over TLS (``docs/sip.md``)."""

    srtp: str = "off"
    """One of ``SRTP_MODES``: ``offer`` takes SRTP when offered and offers it (best effort,
    ``RTP/AVP`` with ``a=crypto``); ``require`` refuses a call without it (488)."""
    ca_file: str = ""
    """CA bundle that verifies TLS peers we call; empty: the system's store."""
    unverified_hosts: tuple[str, ...] = ()
    """Hosts we call over TLS without verifying their certificate (an explicit opt-out)."""


@dataclass(frozen=True, slots=True)
class SipSettings:
    """Everything a :class:`~bridge.sip.ua.SipUserAgent` needs to know."""

    local_host: str = "127.0.0.1"
    """Host (IP or name) we put in Via sent-by and Contact."""
    local_port: int = 5060
    contact_host: str = ""
    """Host put in Contact instead of ``local_host`` (``[sip] external_address``: the
    public address when the daemon sits behind NAT); empty: ``local_host``."""
    """Port of the listening transport."""
    transport: str = "UDP"
    """``UDP``, ``TCP`` or ``TLS``: reliable transports do not retransmit (RFC 3261 §17)."""
    user_agent: str = ""
    """``User-Agent``/``Server`` header; empty sends none (no version banner)."""
    timers: TimerSettings = field(default_factory=TimerSettings)
    allowed_sources: tuple[str, ...] = ()
    """CIDRs allowed to send requests; empty allows everyone. Others are
    dropped silently (not 403: silence keeps the node invisible to scanners)."""
    trusted_proxies: tuple[str, ...] = ()
    """CIDRs of proxies whose ``X-Callbridge-Source`` header names the caller: the
    allowlist and the INVITE rate limit then apply to that caller (refused with
    403 / 503 + Retry-After, not silence); the proxy itself always passes."""
    auth_realm: str = "callbridge"
    auth_users: tuple[SipAuthUser, ...] = ()
    """When non-empty, new INVITEs must carry valid digest credentials."""
    auth_secret: bytes = b"change-me"
    """HMAC key of the stateless nonces (RFC 7616 §3.3 nonce construction)."""
    auth_nonce_lifetime_s: float = 30.0
    """How long a nonce stays valid; older ones get ``stale=true``."""
    auth_max_failures: int = 10
    """Failed digest answers from one source within ``auth_failure_window_s``
    after which it gets 403 without a challenge until the window ends; 0: no limit."""
    auth_failure_window_s: float = 60.0
    invite_rate_per_s: float = 0.0
    """Per-source token-bucket refill rate for new INVITEs; 0 disables the limit."""
    invite_burst: int = 10
    """Per-source token-bucket depth for new INVITEs."""
    max_calls: int = 0
    """Concurrent call limit; 0 disables it. Past it: 503 + Retry-After."""
    retry_after_s: int = 30
    """Retry-After value of our 503 answers."""
    session_expires_s: int = 1800
    """Session interval we ask for / accept (RFC 4028); 0 disables session timers."""
    min_se_s: int = 90
    """Smallest session interval we accept (Min-SE); smaller requests get 422."""
    register_expires_s: int = 3600
    """Expires we ask for in REGISTER; refreshed at half of the granted value."""
    codecs: tuple[str, ...] = ("PCMU", "PCMA")
    """SDP codec preference order."""
    security: SipSecurity = field(default_factory=SipSecurity)
    """SRTP mode and TLS peer verification (``SipSecurity``)."""
