"""Authenticating media-stream WebSockets: pure functions and a replay book.

Theory of operation
-------------------
Every carrier opens the WebSocket *to us*, so anyone who learns the URL can
too. Two layers (reliability.md §3, "what we add"):

1. At the upgrade, the carrier's own proof where it has one:

   * Twilio: ``X-Twilio-Signature`` = base64(HMAC-SHA1(auth token, URL)) over
     the URL Twilio requested, with no parameters (the upgrade is a GET with
     no body). ``twilio_signature_valid`` uses twilio-python's
     ``RequestValidator`` (which tries the URL with and without its default
     port) on the ``wss://`` URL exactly as written in the TwiML and, because
     Twilio does not document which spelling it signs, also on the same URL
     with ``https://``. Build the URL from configuration (``public_url``),
     never from the request's ``Host`` header behind a proxy.
   * Plivo: ``X-Plivo-Signature-V3`` (comma-separated list, one per active
     token) over ``URL.nonce`` with HMAC-SHA256, nonce in
     ``X-Plivo-Signature-V3-Nonce``; the nonce only stops replays if we
     remember it (``ReplayGuard``).
   * Telnyx: the WebSocket itself is not signed; ``streaming_start`` takes a
     ``stream_auth_token`` whose presentation is not documented, so we accept
     it as ``Authorization: Bearer`` or a ``token`` query parameter of the
     ``stream_url`` we chose (``presented_token``). Telnyx *webhooks* are
     signed with Ed25519 over ``timestamp|body`` (``telnyx_webhook_valid``,
     with a replay window), for the HTTP side that starts the stream.
   * Exotel: IP allow-list or Basic auth in the URL userinfo
     (``wss://key:token@host/exotel``, sent as ``Authorization: Basic``).
   * Vonage: nothing on the upgrade; the NCCO ``headers`` arrive in
     ``websocket:connected``, so the per-call token travels there.

   ``shared_token_valid`` compares a presented secret in constant time.

2. In the first message, a **single-use per-call token** minted when the
   call was set up (TwiML ``<Parameter name="token">``, Plivo
   ``extraHeaders``, Exotel URL query, Vonage NCCO header, Telnyx
   ``custom_parameters``): ``TokenBook.mint(call_id, now)`` gives
   ``v1.<expiry_ms>.<nonce>.<mac>`` with ``mac = HMAC-SHA256(secret,
   "v1|call_id|expiry_ms|nonce")``; ``TokenBook.check(token, call_id, now)``
   accepts it once, before expiry, for that call only. Used nonces are
   remembered until their token expires, so memory is bounded by the rate of
   *valid* tokens (forging one needs the secret).

``now`` here is wall-clock seconds (``time.time()`` in the shell) when the
token crosses processes (webhook on one node, WebSocket on another): the
expiry is absolute. The replay memory is per process; several nodes need
sticky routing per call or a shared store (not provided).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import heapq
import hmac
import secrets
from collections.abc import Callable, Mapping
from typing import Literal
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from twilio.request_validator import RequestValidator

__all__ = [
    "ReplayGuard",
    "TokenBook",
    "TokenVerdict",
    "basic_auth_password",
    "plivo_signature_v3",
    "plivo_signature_v3_valid",
    "presented_token",
    "shared_token_valid",
    "telnyx_webhook_valid",
    "twilio_signature",
    "twilio_signature_valid",
    "twilio_webhook_valid",
]

TokenVerdict = Literal["ok", "malformed", "bad_mac", "expired", "replayed"]

_TOKEN_VERSION = "v1"
_MAX_TOKEN_CHARS = 256


# ------------------------------------------------------------------- Twilio


def twilio_signature(auth_token: str, url: str) -> str:
    """The ``X-Twilio-Signature`` Twilio would send for a GET of ``url``."""
    signature: str = RequestValidator(auth_token).compute_signature(url, {})
    return signature


def twilio_signature_valid(auth_token: str, url: str, signature: str | None) -> bool:
    """Whether ``signature`` signs the upgrade URL ``url`` (ws(s):// or https://).

    ``url`` is the public URL from configuration, as written in the TwiML.
    """
    if not auth_token or not signature or not signature.isascii():
        return False
    validator = RequestValidator(auth_token)
    candidates = [url]
    scheme, rest = url.split("://", 1) if "://" in url else ("", url)
    if scheme == "wss":
        candidates.append("https://" + rest)
    elif scheme == "ws":
        candidates.append("http://" + rest)
    return any(bool(validator.validate(candidate, {}, signature)) for candidate in candidates)


def twilio_webhook_valid(
    auth_token: str, url: str, params: Mapping[str, str], signature: str | None
) -> bool:
    """Whether ``signature`` signs a POST of form ``params`` to ``url`` (the voice webhook).

    Twilio signs the full URL it requested followed by every POST parameter
    sorted by name (``RequestValidator``; it also tries the URL with and
    without its default port). ``url`` is the public URL from configuration.
    The signature has no timestamp or nonce: pair it with a replay memory.
    """
    if not auth_token or not signature or not signature.isascii():
        return False
    return bool(RequestValidator(auth_token).validate(url, dict(params), signature))


# -------------------------------------------------------------------- Plivo


def plivo_signature_v3(auth_token: str, url: str, nonce: str) -> str:
    """``X-Plivo-Signature-V3`` for a GET of ``url`` (query sorted by name)."""
    parts = urlsplit(url)
    query = urlencode(sorted(parse_qsl(parts.query, keep_blank_values=True)))
    base = urlunsplit((parts.scheme, parts.netloc, parts.path, "", ""))
    if query:
        base += "?" + query
    digest = hmac.new(auth_token.encode(), f"{base}.{nonce}".encode(), hashlib.sha256).digest()
    return base64.b64encode(digest).decode("ascii")


def plivo_signature_v3_valid(
    auth_token: str, url: str, nonce: str | None, signature: str | None
) -> bool:
    """Whether one of the comma-separated ``signature`` values signs ``url`` + ``nonce``.

    Pair it with a ``ReplayGuard`` on the nonce to refuse replays.
    """
    if not auth_token or not nonce or not signature or not signature.isascii():
        return False
    expected = plivo_signature_v3(auth_token, url, nonce)
    return any(hmac.compare_digest(expected, s.strip()) for s in signature.split(","))


# ------------------------------------------------------------------- Telnyx


def telnyx_webhook_valid(
    public_key_b64: str,
    signature_b64: str | None,
    timestamp: str | None,
    body: bytes,
    now: float,
    tolerance_s: float = 300.0,
) -> bool:
    """Ed25519 check of a Telnyx webhook (``telnyx-signature-ed25519``, ``telnyx-timestamp``).

    The signed data is ``timestamp|body``; a timestamp further than
    ``tolerance_s`` from ``now`` (Unix seconds) is refused (replay window).
    """
    if not signature_b64 or not timestamp or not timestamp.isascii() or not timestamp.isdigit():
        return False
    if abs(now - int(timestamp)) > tolerance_s:
        return False
    # here, not at the top: ``cryptography`` is about 6 MB resident, and only this check needs it
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    try:
        key = Ed25519PublicKey.from_public_bytes(base64.b64decode(public_key_b64, validate=True))
        signature = base64.b64decode(signature_b64, validate=True)
        key.verify(signature, timestamp.encode("ascii") + b"|" + body)
    except (InvalidSignature, ValueError, binascii.Error):
        return False
    return True


# --------------------------------------------------- shared secrets (all)


def shared_token_valid(expected: str, presented: str | None) -> bool:
    """Constant-time comparison of a configured secret with what the peer sent."""
    if not expected or presented is None:
        return False
    return hmac.compare_digest(expected.encode(), presented.encode("utf-8", "surrogatepass"))


def basic_auth_password(authorization: str | None) -> str | None:
    """The password of an ``Authorization: Basic`` header (Exotel URL userinfo)."""
    if not authorization or authorization[:6].lower() != "basic ":
        return None
    try:
        decoded = base64.b64decode(authorization[6:].strip(), validate=True).decode("utf-8")
    except (binascii.Error, ValueError):
        return None
    _user, sep, password = decoded.partition(":")
    return password if sep else None


def presented_token(
    headers: Mapping[str, str], query: Mapping[str, str], name: str = "token"
) -> str | None:
    """A secret presented at the upgrade: ``Authorization: Bearer``, Basic password, or ``?token=``.

    ``headers`` keys are matched case-insensitively.
    """
    lowered = {k.lower(): v for k, v in headers.items()}
    authorization = lowered.get("authorization", "")
    if authorization[:7].lower() == "bearer ":
        return authorization[7:].strip()
    password = basic_auth_password(authorization)
    if password is not None:
        return password
    return query.get(name)


# ------------------------------------------------------- single-use tokens


class ReplayGuard:
    """Remembers one-time values (nonces) until they expire; pure, takes ``now``.

    Expiries sit in a heap, so forgetting costs O(log n) per value, not a scan.
    """

    __slots__ = ("_expiry_by_nonce", "_heap")

    def __init__(self) -> None:
        self._expiry_by_nonce: dict[str, float] = {}
        self._heap: list[tuple[float, str]] = []

    def __len__(self) -> int:
        return len(self._expiry_by_nonce)

    def first_use(self, nonce: str, expires_at: float, now: float) -> bool:
        """Record ``nonce`` until ``expires_at``; ``False`` if it was already seen."""
        self.forget_expired(now)
        if nonce in self._expiry_by_nonce:
            return False
        self._expiry_by_nonce[nonce] = expires_at
        heapq.heappush(self._heap, (expires_at, nonce))
        return True

    def forget_expired(self, now: float) -> None:
        """Drop nonces whose expiry has passed (a replay then fails on expiry instead)."""
        heap = self._heap
        while heap and heap[0][0] <= now:
            at, nonce = heapq.heappop(heap)
            if self._expiry_by_nonce.get(nonce) == at:
                del self._expiry_by_nonce[nonce]


class TokenBook:
    """Mints and checks single-use, expiring, per-call stream tokens.

    Args:
        secret: the HMAC key (at least 16 bytes), shared by every node.
        ttl_s: lifetime of a token from minting, in seconds.
        random_bytes: source of nonces (inject a fixed one in tests).
    """

    __slots__ = ("_guard", "_random_bytes", "_secret", "ttl_s")

    def __init__(
        self,
        secret: bytes,
        ttl_s: float = 30.0,
        random_bytes: Callable[[int], bytes] = secrets.token_bytes,
    ) -> None:
        if len(secret) < 16:
            raise ValueError("the token secret must be at least 16 bytes")
        self._secret = secret
        self.ttl_s = ttl_s
        self._random_bytes = random_bytes
        self._guard = ReplayGuard()

    @property
    def remembered(self) -> int:
        """Used nonces still remembered (bounded by valid tokens per ``ttl_s``)."""
        return len(self._guard)

    def mint(self, call_id: str, now: float) -> str:
        """A fresh token for ``call_id``, valid for ``ttl_s`` from ``now``."""
        expiry_ms = int((now + self.ttl_s) * 1000)
        nonce = base64.urlsafe_b64encode(self._random_bytes(16)).decode("ascii").rstrip("=")
        return f"{_TOKEN_VERSION}.{expiry_ms}.{nonce}.{self._mac(call_id, expiry_ms, nonce)}"

    def check(self, token: str | None, call_id: str, now: float) -> TokenVerdict:
        """Verify ``token`` for ``call_id`` at ``now`` and burn it; say why it fails."""
        self._guard.forget_expired(now)
        parts = _split_token(token)
        if parts is None:
            return "malformed"
        expiry_ms, nonce, mac = parts
        if not hmac.compare_digest(mac, self._mac(call_id, expiry_ms, nonce)):
            return "bad_mac"  # forged, tampered, or minted for another call
        expires_at = expiry_ms / 1000
        if now >= expires_at:
            return "expired"
        if not self._guard.first_use(nonce, expires_at, now):
            return "replayed"
        return "ok"

    def verify(self, token: str | None, call_id: str, now: float) -> bool:
        """``check(...) == "ok"``."""
        return self.check(token, call_id, now) == "ok"

    def _mac(self, call_id: str, expiry_ms: int, nonce: str) -> str:
        msg = f"{_TOKEN_VERSION}|{call_id}|{expiry_ms}|{nonce}".encode()
        digest = hmac.new(self._secret, msg, hashlib.sha256).digest()
        return base64.urlsafe_b64encode(digest).decode("ascii").rstrip("=")


def _split_token(token: str | None) -> tuple[int, str, str] | None:
    if not token or len(token) > _MAX_TOKEN_CHARS:
        return None
    fields = token.split(".")
    if len(fields) != 4 or fields[0] != _TOKEN_VERSION:
        return None
    _, expiry, nonce, mac = fields
    if not (expiry.isascii() and expiry.isdigit() and len(expiry) <= 15 and nonce and mac):
        return None
    if not all(_is_b64url(part) for part in (nonce, mac)):
        return None
    return int(expiry), nonce, mac


def _is_b64url(text: str) -> bool:
    return text.isascii() and all(c.isalnum() or c in "-_" for c in text)
