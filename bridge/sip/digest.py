"""HTTP Digest authentication for SIP (RFC 2617, RFC 7616, RFC 8760, RFC 3261 §22).

Theory of operation
-------------------
Client side (UAC): ``parse_challenge`` reads a ``WWW-Authenticate`` /
``Proxy-Authenticate`` value, ``choose_challenge`` takes the first one whose
algorithm we support (a server may offer several, strongest first: RFC 8760
§2.4), and ``authorization`` builds the ``Authorization`` /
``Proxy-Authorization`` value (``qop=auth`` with cnonce and nc when offered;
``-sess`` variants supported). The caller supplies the cnonce, so tests are
deterministic. :class:`DigestClient` keeps what one request sequence (an
outbound INVITE and its retries, a registration) has answered, so each
challenge is answered once and a refused answer never loops.

Server side (UAS): :class:`DigestVerifier` issues challenges and verifies
answers without per-challenge state. A nonce is
``base64(issue_time || HMAC-SHA256(secret, issue_time || realm)[:16])``: it
proves we issued it, when, and to whom (the MAC also covers a *binding*: the
transport and source address the challenge went to), so verification needs
only the secret and ``now``. A bounded memory of each nonce's highest nonce
count refuses replays (``nc`` must increase; a nonce without ``qop`` is good
once; a wrong answer burns the nonce); a nonce that memory has forgotten reads
as stale, so eviction never reopens a replay.

Rules:

1. An unknown user, a wrong password, a foreign scheme, a malformed header and
   a replay all give the same ``AuthResult.FAILED``, and the caller answers
   all of them with the same fresh challenge: nothing tells a scanner whether
   the user exists (reliability.md §2.1, svwar). The digest is computed
   against a dummy password for unknown users so that the work done is equal.
2. An expired but genuine nonce gives ``STALE`` (re-challenge with
   ``stale=true``); ``now`` is a parameter, never a clock read.
3. Comparisons are constant time (``hmac.compare_digest``) over bytes; a
   header that is not ASCII fails before any comparison (a ``str`` with
   non-ASCII characters makes ``compare_digest`` raise).
"""

from __future__ import annotations

import base64
import enum
import hashlib
import hmac
import math
import re
import struct
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from bridge.sip.errors import SipParseError
from bridge.sip.uri import split_list, unquote

__all__ = [
    "AuthResult",
    "Challenge",
    "DigestClient",
    "DigestCredentials",
    "DigestVerifier",
    "authorization",
    "choose_challenge",
    "compute_response",
    "parse_auth_params",
    "parse_challenge",
]

_HASHES: dict[str, Callable[[bytes], str]] = {
    "MD5": lambda data: hashlib.md5(data).hexdigest(),
    "SHA-256": lambda data: hashlib.sha256(data).hexdigest(),
}
if "sha512_256" in hashlib.algorithms_available:
    _HASHES["SHA-512-256"] = lambda data: hashlib.new("sha512_256", data).hexdigest()
MAX_REPLAY_MEMORY = 16384
"""Most nonces whose last nonce count is remembered; older ones read as stale."""
NONCE_LIFETIME_S = 30.0
"""How long a nonce we issued may be answered (then ``STALE``: re-challenge)."""
_NC_RE = re.compile(r"[0-9a-fA-F]{8}")
_NONCE_MAC_BYTES = 16


class AuthResult(enum.Enum):
    OK = "ok"
    STALE = "stale"
    FAILED = "failed"


@dataclass(frozen=True, slots=True)
class Challenge:
    """One Digest challenge."""

    realm: str
    nonce: str
    algorithm: str = "MD5"
    qop: tuple[str, ...] = ()
    opaque: str | None = None
    stale: bool = False


def _base_algorithm(algorithm: str) -> str:
    upper = algorithm.upper()
    return upper[: -len("-SESS")] if upper.endswith("-SESS") else upper


def parse_auth_params(value: str) -> tuple[str, dict[str, str]]:
    """Split ``Scheme a=b, c="d"`` into the scheme and its (unquoted) parameters."""
    scheme, _, rest = value.strip().partition(" ")
    params: dict[str, str] = {}
    for item in split_list(rest):
        name, eq, raw = item.partition("=")
        if not eq:
            raise SipParseError("malformed auth parameter")
        params[name.strip().lower()] = unquote(raw.strip())
    return scheme, params


def parse_challenge(value: str) -> Challenge | None:
    """Parse a WWW-/Proxy-Authenticate value; None if it is not a usable Digest one."""
    try:
        scheme, params = parse_auth_params(value)
    except SipParseError:
        return None
    if scheme.lower() != "digest" or "realm" not in params or "nonce" not in params:
        return None
    echoed = (params["realm"], params["nonce"], params.get("opaque", ""))
    if any('"' in v or "\\" in v or not v.isprintable() for v in echoed):
        return None  # an answer quoting it back would not parse (found by bench/fuzz)
    qop = tuple(q.strip() for q in params.get("qop", "").split(",") if q.strip())
    return Challenge(
        realm=params["realm"],
        nonce=params["nonce"],
        algorithm=params.get("algorithm", "MD5"),
        qop=qop,
        opaque=params.get("opaque"),
        stale=params.get("stale", "").lower() == "true",
    )


def choose_challenge(values: Sequence[str]) -> Challenge | None:
    """The first challenge whose algorithm we implement, in the server's order."""
    for value in values:
        challenge = parse_challenge(value)
        if challenge and _base_algorithm(challenge.algorithm) in _HASHES:
            return challenge
    return None


def compute_response(
    *,
    algorithm: str,
    username: str,
    realm: str,
    password: str,
    nonce: str,
    method: str,
    uri: str,
    qop: str | None = None,
    nc: str = "",
    cnonce: str = "",
) -> str:
    """The ``response`` value (RFC 7616 §3.4.1; RFC 2617 §3.2.2 without qop)."""
    digest = _HASHES[_base_algorithm(algorithm)]
    ha1 = digest(f"{username}:{realm}:{password}".encode())
    if algorithm.upper().endswith("-SESS"):
        ha1 = digest(f"{ha1}:{nonce}:{cnonce}".encode())
    ha2 = digest(f"{method}:{uri}".encode())
    if qop:
        return digest(f"{ha1}:{nonce}:{nc}:{cnonce}:{qop}:{ha2}".encode())
    return digest(f"{ha1}:{nonce}:{ha2}".encode())


def authorization(
    challenge: Challenge,
    *,
    username: str,
    password: str,
    method: str,
    uri: str,
    cnonce: str,
    nc: int = 1,
) -> str:
    """The Authorization / Proxy-Authorization value answering ``challenge``."""
    qop = "auth" if "auth" in challenge.qop else None
    nc_text = f"{nc:08x}"
    response = compute_response(
        algorithm=challenge.algorithm,
        username=username,
        realm=challenge.realm,
        password=password,
        nonce=challenge.nonce,
        method=method,
        uri=uri,
        qop=qop,
        nc=nc_text,
        cnonce=cnonce,
    )
    parts = [
        f'username="{username}"',
        f'realm="{challenge.realm}"',
        f'nonce="{challenge.nonce}"',
        f'uri="{uri}"',
        f'response="{response}"',
        f"algorithm={challenge.algorithm}",
    ]
    if qop:
        parts += [f"qop={qop}", f"nc={nc_text}", f'cnonce="{cnonce}"']
    if challenge.opaque is not None:
        parts.append(f'opaque="{challenge.opaque}"')
    return "Digest " + ", ".join(parts)


class DigestVerifier:
    """Stateless-nonce Digest challenges and verification for a UAS."""

    def __init__(
        self,
        realm: str,
        secret: bytes,
        users: Mapping[str, str],
        nonce_lifetime_s: float = NONCE_LIFETIME_S,
        algorithms: Sequence[str] = ("SHA-256", "MD5"),
    ) -> None:
        self.realm = realm
        self._secret = secret
        self._users = dict(users)
        self._lifetime_s = nonce_lifetime_s
        self._algorithms = [a for a in algorithms if _base_algorithm(a) in _HASHES]
        # nonce -> highest nc used with it (-1: burnt by a failed answer or a qop-less use)
        self._last_nc: OrderedDict[str, int] = OrderedDict()
        # nonces issued at or before this were forgotten: treated as stale
        self._forgotten_before = float("-inf")

    def nonce(self, now: float, binding: str = "") -> str:
        """A fresh nonce; ``binding`` (transport and source address) must match at verify."""
        stamp = struct.pack("!d", now)
        return base64.b64encode(stamp + self._nonce_mac(stamp, binding)).decode()

    def _nonce_mac(self, stamp: bytes, binding: str) -> bytes:
        msg = stamp + self.realm.encode() + b"\x00" + binding.encode("utf-8", "replace")
        return hmac.new(self._secret, msg, hashlib.sha256).digest()[:_NONCE_MAC_BYTES]

    def challenges(self, now: float, stale: bool = False, binding: str = "") -> list[str]:
        """WWW-Authenticate values, one per algorithm, strongest first (RFC 8760)."""
        nonce = self.nonce(now, binding)
        suffix = ", stale=true" if stale else ""
        return [
            f'Digest realm="{self.realm}", nonce="{nonce}", algorithm={algorithm}, '
            f'qop="auth"{suffix}'
            for algorithm in self._algorithms
        ]

    def _nonce_issued_at(self, nonce: str, binding: str) -> float | None:
        if not nonce.isascii():
            return None
        try:
            raw = base64.b64decode(nonce, validate=True)
        except ValueError:
            return None
        if len(raw) != 8 + _NONCE_MAC_BYTES:
            return None
        stamp, mac = raw[:8], raw[8:]
        if not hmac.compare_digest(mac, self._nonce_mac(stamp, binding)):
            return None  # not ours, or issued to another transport or source
        (issued_at,) = struct.unpack("!d", stamp)
        return float(issued_at) if math.isfinite(issued_at) else None

    def verify(self, header: str | None, method: str, now: float, binding: str = "") -> AuthResult:
        """Check an Authorization value for a request with ``method`` from ``binding``.

        ``binding`` names the transport and source address the request came
        from (what ``challenges`` was given): a nonce answered from elsewhere
        fails. With ``qop`` the nonce count must increase from one answer to
        the next; without it a nonce is good once; a wrong answer burns the
        nonce (a guesser needs a fresh challenge per guess).

        Returns:
            OK, STALE (genuine nonce too old: re-challenge with stale=true) or
            FAILED (everything else, indistinguishably).
        """
        if header is None or not header.isascii():
            return AuthResult.FAILED
        try:
            scheme, params = parse_auth_params(header)
        except SipParseError:
            return AuthResult.FAILED
        needed = ("username", "realm", "nonce", "uri", "response")
        if scheme.lower() != "digest" or any(k not in params for k in needed):
            return AuthResult.FAILED
        algorithm = params.get("algorithm", "MD5")
        if algorithm not in self._algorithms or params["realm"] != self.realm:
            return AuthResult.FAILED
        nonce = params["nonce"]
        issued_at = self._nonce_issued_at(nonce, binding)
        if issued_at is None or issued_at > now:
            return AuthResult.FAILED
        qop = params.get("qop")
        nc_text = params.get("nc", "")
        if qop is not None and (qop != "auth" or not _NC_RE.fullmatch(nc_text)):
            return AuthResult.FAILED
        nc = int(nc_text, 16) if qop is not None else 0
        known = params["username"] in self._users
        password = self._users.get(params["username"], "\x00unknown-user\x00")
        expected = compute_response(
            algorithm=algorithm,
            username=params["username"],
            realm=self.realm,
            password=password,
            nonce=nonce,
            method=method,
            uri=params["uri"],
            qop=qop,
            nc=nc_text,
            cnonce=params.get("cnonce", ""),
        )
        matches = hmac.compare_digest(expected.encode(), params["response"].lower().encode())
        last = self._last_nc.get(nonce)
        if not (known and matches):
            if now - issued_at <= self._lifetime_s:
                self._record(nonce, -1, issued_at)  # burnt: no second guess on it
            return AuthResult.FAILED
        if now - issued_at > self._lifetime_s or issued_at <= self._forgotten_before:
            return AuthResult.STALE
        if last is not None and (last < 0 or qop is None or nc <= last):
            return AuthResult.FAILED  # a replayed answer, or a nonce already used up
        self._record(nonce, nc if qop is not None else -1, issued_at)
        return AuthResult.OK

    def _record(self, nonce: str, nc: int, issued_at: float) -> None:
        self._last_nc[nonce] = nc
        self._last_nc.move_to_end(nonce)
        while len(self._last_nc) > MAX_REPLAY_MEMORY:
            forgotten, _ = self._last_nc.popitem(last=False)
            raw = base64.b64decode(forgotten)
            (forgotten_at,) = struct.unpack("!d", raw[:8])
            self._forgotten_before = max(self._forgotten_before, float(forgotten_at))


# --- client side: answering the challenges of one request sequence -------------------------

MAX_DIGEST_ROUNDS = 4
"""Most challenged answers one request sequence sends (a 407 and a 401, each stale once)."""


@dataclass(frozen=True, slots=True)
class DigestCredentials:
    """A username and password to answer challenges with (a registration's, or a trunk's).

    ``realm`` restricts them to challenges of that realm (None: any realm).
    The password is never in ``repr``.
    """

    username: str
    password: str = field(repr=False)
    realm: str | None = None


class DigestClient:
    """Answers the 401/407 challenges of one request sequence (RFC 3261 §22.2, §22.3).

    One per outbound INVITE (its retries share it) and one per registration.
    ``on_challenge(status, values)`` decides whether to send the request
    again; ``headers(method, uri, cnonce)`` gives the Authorization /
    Proxy-Authorization values for it: one per challenge held, so a retry
    after a proxy's 407 and then the callee's 401 carries both answers, the
    older one with its nonce count incremented (RFC 7616 §3.4).

    Rules (never loop):

    1. A challenge is answered once. Another challenge for a (header, realm)
       we already answered means the answer was refused: it ends the attempt,
       whatever its nonce, unless it says ``stale=true`` (the nonce expired,
       the credentials were right: RFC 7616 §3.3), which is answered once
       more per (header, realm).
    2. No more than :data:`MAX_DIGEST_ROUNDS` answers per sequence.
    3. ``reset()`` forgets everything (a registration refresh starts afresh).
    """

    __slots__ = ("_credentials", "_held", "_nc", "_rounds", "_stale_used")

    def __init__(self, credentials: DigestCredentials) -> None:
        self._credentials = credentials
        self._held: dict[tuple[bool, str], Challenge] = {}
        self._nc: dict[str, int] = {}
        self._stale_used: set[tuple[bool, str]] = set()
        self._rounds = 0

    def __repr__(self) -> str:
        return f"DigestClient(username={self._credentials.username!r}, held={len(self._held)})"

    def reset(self) -> None:
        self._held.clear()
        self._nc.clear()
        self._stale_used.clear()
        self._rounds = 0

    def _choose(self, values: Sequence[str]) -> Challenge | None:
        realm = self._credentials.realm
        for value in values:
            challenge = parse_challenge(value)
            if (
                challenge is not None
                and _base_algorithm(challenge.algorithm) in _HASHES
                and (realm is None or challenge.realm == realm)
            ):
                return challenge
        return None

    def on_challenge(self, status: int, values: Sequence[str]) -> bool:
        """A 401 (``WWW-Authenticate`` values) or 407 (``Proxy-Authenticate``) arrived.

        Returns:
            True: send the request again with ``headers()``; False: the
            attempt has failed (no usable challenge, or rule 1 or 2).
        """
        if status not in (401, 407) or self._rounds >= MAX_DIGEST_ROUNDS:
            return False
        challenge = self._choose(values)
        if challenge is None:
            return False
        key = (status == 407, challenge.realm)
        if key in self._held:
            if not challenge.stale or key in self._stale_used:
                return False
            self._stale_used.add(key)
        self._held[key] = challenge
        self._rounds += 1
        return True

    def headers(self, method: str, uri: str, cnonce: str) -> list[tuple[str, str]]:
        """(header name, value) answering every held challenge, for one request."""
        out: list[tuple[str, str]] = []
        for (proxy, _realm), challenge in self._held.items():
            nc = self._nc.get(challenge.nonce, 0) + 1
            self._nc[challenge.nonce] = nc
            value = authorization(
                challenge,
                username=self._credentials.username,
                password=self._credentials.password,
                method=method,
                uri=uri,
                cnonce=cnonce,
                nc=nc,
            )
            out.append(("Proxy-Authorization" if proxy else "Authorization", value))
        return out
