"""SDP for one audio stream: parse, offer/answer (RFC 8866, RFC 3264, RFC 3551, RFC 4733).

Theory of operation
-------------------
Pure functions over frozen dataclasses; no state is kept here (the dialog
keeps the o= session id and version).

* ``parse_sdp(text)`` reads the lines we need (v, o, s, c, t, m, a=rtpmap,
  fmtp, ptime, direction, rtcp, rtcp-mux) at session and media level and keeps
  the other attributes raw. Malformed input raises :class:`SdpError`
  (a ``ValueError``); the user agent turns it into ``400``/``488``.
* ``negotiate(offer, codecs)`` picks the first audio ``m=`` line speaking
  RTP/AVP with a codec from our preference list (PCMU=0 / PCMA=8 / G722=9,
  or a dynamic payload type mapped to them; Opus at whatever dynamic payload
  type the peer maps ``opus/48000/2`` to, RFC 7587) plus ``telephone-event``
  at the chosen codec's RTP clock (8 kHz, or 48 kHz for Opus: RFC 4733 §2.1
  wants the audio's clock), keeping the offerer's payload type numbers.
  ``None`` means "no match": 488. Opus's ``a=fmtp`` is read into
  ``OpusParams`` (``maxplaybackrate``, ``stereo``, ``sprop-stereo``,
  ``useinbandfec``; the rest is ignored).
* ``build_answer`` answers every ``m=`` line in order (RFC 3264 §6): the chosen
  one with our address, port and ``ptime:20``, the others with port 0. The
  answered direction follows §6.1: sendonly -> recvonly, recvonly -> sendonly,
  inactive -> inactive, intersected with the direction we want.
* ``build_offer`` makes the offer of an outbound call; ``negotiate`` also
  reads the answer to it.
* Hold (RFC 3264 §8.4): the remote side is on hold when it offers sendonly or
  inactive, or the legacy ``c=0.0.0.0`` (RFC 2543).
* SDES (RFC 4568): ``SdesCrypto.parse`` / ``to_attribute`` / ``generate`` for
  ``a=crypto`` with ``AES_CM_128_HMAC_SHA1_80`` and ``_32``; ``parse_sdp``
  keeps every usable one of an ``m=`` line in ``MediaDescription.crypto``
  (others, and malformed ones, are skipped: an offer may list suites we do
  not have); ``choose_crypto`` answers an offer (§7.1.1: the first offered
  suite we support, its tag, our own key). The key is never in a ``repr``,
  so it cannot reach a log line through one. ``negotiate`` takes ``RTP/SAVP``
  as well as ``RTP/AVP`` and keeps the stream's crypto; ``srtp_refusal`` says
  why an offer cannot be taken under an ``srtp`` mode over a transport (SDES
  keys only over TLS); the answer's profile mirrors the offer's (``RTP/AVP``
  with ``a=crypto`` is best-effort SRTP).
"""

from __future__ import annotations

import base64
import binascii
import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Final, Literal

from bridge.sip.uri import ascii_digits

__all__ = [
    "CLOCK_RATES_HZ",
    "CODECS",
    "OPUS_EVENT_PT",
    "OPUS_FMTP",
    "OPUS_PT",
    "PAYLOAD_TYPES",
    "SDES_SUITES",
    "STATIC_PAYLOAD_TYPES",
    "Codec",
    "Direction",
    "MediaDescription",
    "NegotiatedAudio",
    "OpusParams",
    "Origin",
    "SdesCrypto",
    "SdpError",
    "SessionDescription",
    "answer_direction",
    "build_answer",
    "build_offer",
    "choose_crypto",
    "negotiate",
    "parse_sdp",
    "srtp_refusal",
]

Direction = Literal["sendrecv", "sendonly", "recvonly", "inactive"]
Codec = Literal["PCMU", "PCMA", "G722", "OPUS"]
"""The audio codecs we negotiate (RFC 3551 static payload types 0, 8 and 9; Opus dynamic)."""
CODECS: Final[tuple[Codec, ...]] = ("PCMU", "PCMA", "G722", "OPUS")
"""Every codec we speak."""
_DIRECTIONS: tuple[Direction, ...] = ("sendrecv", "sendonly", "recvonly", "inactive")
MAX_SDP_LINES = 256
"""Most lines accepted in one SDP body."""
MAX_MEDIA_LINES = 16
"""Most ``m=`` lines accepted in one SDP body."""
STATIC_PAYLOAD_TYPES: Final[dict[int, Codec]] = {0: "PCMU", 8: "PCMA", 9: "G722"}
OPUS_PT: Final = 111
"""The dynamic payload type we offer Opus at (the common choice: WebRTC's); in an
answer we keep whatever the offerer mapped ``opus/48000/2`` to."""
OPUS_EVENT_PT: Final = 110
"""The payload type we offer ``telephone-event/48000`` at, beside Opus."""
OPUS_FMTP: Final = "maxplaybackrate=16000;sprop-maxcapturerate=16000"
"""Our Opus ``a=fmtp`` (RFC 7587 §6.1): we decode and capture at 16 kHz (the leg's
rate), so the sender may spend no bits above 8 kHz. Mono is the default (no
``stereo``); no ``useinbandfec=1``, since FFmpeg's libopus decoder does not use FEC."""
PAYLOAD_TYPES: Final[dict[Codec, int]] = {
    **{name: pt for pt, name in STATIC_PAYLOAD_TYPES.items()},
    "OPUS": OPUS_PT,
}
"""The payload type of each codec in our offers."""
CLOCK_RATE_HZ = 8000
"""The RTP clock of G.711 and G.722 too: RFC 3551 §4.5.2 keeps G.722's historical 8000
(``G722/8000``) although it samples at 16 kHz, so a 20 ms frame is still 160 ticks."""
CLOCK_RATES_HZ: Final[dict[Codec, int]] = {
    "PCMU": CLOCK_RATE_HZ,
    "PCMA": CLOCK_RATE_HZ,
    "G722": CLOCK_RATE_HZ,
    "OPUS": 48000,
}
"""Each codec's RTP clock: Opus's is always 48 kHz (RFC 7587 §4.1), 960 ticks per 20 ms."""
PTIME_MS = 20


class SdpError(ValueError):
    """The SDP body is malformed."""


SDES_SUITES: Final = ("AES_CM_128_HMAC_SHA1_80", "AES_CM_128_HMAC_SHA1_32")
"""The RFC 4568 §6.2 suites we take, in our preference order."""
SDES_KEY_SALT_BYTES: Final = 30
"""Both suites: a 16-byte master key and a 14-byte master salt."""


@dataclass(frozen=True, slots=True)
class SdesCrypto:
    """One ``a=crypto`` attribute (RFC 4568 §9.1) of a suite in ``SDES_SUITES``.

    ``key_salt`` is never in ``repr`` (nor in any error message here).
    """

    tag: int
    key_salt: bytes = field(repr=False)
    lifetime: str | None = None
    suite: str = SDES_SUITES[0]

    @property
    def auth_tag_bits(self) -> int:
        """80 or 32: the length of the HMAC-SHA1 tag on each SRTP packet."""
        return 32 if self.suite.endswith("_32") else 80

    @classmethod
    def generate(
        cls, tag: int, random_bytes: Callable[[int], bytes], suite: str = SDES_SUITES[0]
    ) -> SdesCrypto:
        """A fresh key for our side (``random_bytes`` = ``secrets.token_bytes``)."""
        if suite not in SDES_SUITES:
            raise ValueError(f"unsupported crypto suite {suite}")
        return cls(tag, random_bytes(SDES_KEY_SALT_BYTES), None, suite)

    @classmethod
    def parse(cls, attribute: str) -> SdesCrypto:
        """Parse ``a=crypto:1 AES_CM_128_HMAC_SHA1_80 inline:KEY[|lifetime]``.

        Raises:
            SdpError: malformed attribute, another suite, a key that is not
                30 bytes of base64, an MKI, or several keys.
        """
        text = attribute.strip().removeprefix("a=").removeprefix("crypto:")
        fields = text.split()
        if len(fields) < 3:
            raise SdpError("crypto attribute needs tag, suite and key params")
        tag_text, suite, key_params = fields[:3]
        if not ascii_digits(tag_text) or len(tag_text) > 9:
            raise SdpError(f"crypto tag must be 1-9 digits, got {tag_text[:12]!r}")
        if suite not in SDES_SUITES:
            raise SdpError(f"unsupported crypto suite {suite[:40]}, only {', '.join(SDES_SUITES)}")
        if ";" in key_params:
            raise SdpError("several crypto keys (';') are not supported")
        method, _, key_info = key_params.partition(":")
        if method != "inline":
            raise SdpError(f"crypto key method must be inline, got {method[:12]!r}")
        key_text, *params = key_info.split("|")
        try:
            key_salt = base64.b64decode(key_text, validate=True)
        except (binascii.Error, ValueError):
            raise SdpError("crypto key is not base64") from None
        if len(key_salt) != SDES_KEY_SALT_BYTES:
            raise SdpError(f"crypto key||salt is {len(key_salt)} bytes, {suite} needs 30")
        lifetime = None
        for param in params:
            if ":" in param:
                raise SdpError("crypto MKI is not supported")
            lifetime = param
        return cls(int(tag_text), key_salt, lifetime, suite)

    def to_attribute(self) -> str:
        """The SDP attribute value, without the ``a=`` prefix (it holds the key)."""
        key = base64.b64encode(self.key_salt).decode("ascii")
        lifetime = f"|{self.lifetime}" if self.lifetime else ""
        return f"crypto:{self.tag} {self.suite} inline:{key}{lifetime}"


def choose_crypto(
    offered: Sequence[SdesCrypto], random_bytes: Callable[[int], bytes]
) -> SdesCrypto | None:
    """Our answer to an SDES offer (RFC 4568 §7.1.1): the first offered attribute
    whose suite we support, with its tag and suite and our own fresh key; None if
    there is none (a ``RTP/SAVP`` offer then gets 488)."""
    for crypto in offered:
        if crypto.suite in SDES_SUITES:
            return SdesCrypto.generate(crypto.tag, random_bytes, crypto.suite)
    return None


@dataclass(frozen=True, slots=True)
class Origin:
    username: str
    session_id: str
    session_version: int
    address_type: str
    address: str


@dataclass(frozen=True, slots=True)
class MediaDescription:
    media: str
    port: int
    proto: str
    formats: tuple[str, ...]
    connection: str | None = None
    rtpmap: tuple[tuple[int, str, int], ...] = ()
    """(payload type, encoding name, clock rate)."""
    fmtp: tuple[tuple[int, str], ...] = ()
    ptime_ms: int | None = None
    direction: Direction | None = None
    rtcp_port: int | None = None
    rtcp_mux: bool = False
    crypto: tuple[SdesCrypto, ...] = ()
    """The usable ``a=crypto`` attributes, in the offered order (keys hidden from repr)."""


@dataclass(frozen=True, slots=True)
class SessionDescription:
    origin: Origin
    connection: str | None
    direction: Direction | None
    media: tuple[MediaDescription, ...]
    timing: str = "0 0"


@dataclass(frozen=True, slots=True)
class OpusParams:
    """The peer's Opus ``a=fmtp`` parameters we use (RFC 7587 §6.1; others are ignored)."""

    max_playback_rate_hz: int = 48000
    """``maxplaybackrate``: the most the peer will play (below 16000 we code narrower)."""
    stereo: bool = False
    """``stereo=1``: the peer prefers to receive stereo (we send mono anyway, always allowed)."""
    sprop_stereo: bool = False
    """``sprop-stereo=1``: the peer may send stereo (decoded to mono here)."""
    use_inband_fec: bool = False
    """``useinbandfec=1``: the peer's decoder uses in-band FEC, so our encoder adds it."""

    @classmethod
    def parse(cls, params: str) -> OpusParams:
        """From an ``a=fmtp`` value; bad or unknown parameters are ignored, never raised."""
        values: dict[str, str] = {}
        for item in params.split(";"):
            name, eq, value = item.strip().partition("=")
            if eq:
                values[name.strip().lower()] = value.strip()
        rate = values.get("maxplaybackrate", "")
        return cls(
            max_playback_rate_hz=int(rate) if ascii_digits(rate) and 0 < len(rate) <= 6 else 48000,
            stereo=values.get("stereo") == "1",
            sprop_stereo=values.get("sprop-stereo") == "1",
            use_inband_fec=values.get("useinbandfec") == "1",
        )


@dataclass(frozen=True, slots=True)
class NegotiatedAudio:
    """The outcome of offer/answer for the audio stream."""

    media_index: int
    codec: Codec
    payload_type: int
    telephone_event_pt: int | None
    remote_addr: tuple[str, int] | None
    """Where to send RTP; None while the peer holds with ``c=0.0.0.0`` or port 0."""
    remote_direction: Direction
    ptime_ms: int
    proto: str = "RTP/AVP"
    """``RTP/AVP`` or ``RTP/SAVP`` (SRTP, RFC 3711)."""
    crypto: tuple[SdesCrypto, ...] = ()
    """The stream's usable ``a=crypto`` attributes (RFC 4568), in the offered order."""
    clock_rate_hz: int = CLOCK_RATE_HZ
    """The codec's RTP clock (and telephone-event's): 8000, or 48000 for Opus."""
    opus: OpusParams | None = None
    """Opus only: the peer's ``a=fmtp`` parameters."""

    @property
    def samples_per_frame(self) -> int:
        """RTP timestamp units per 20 ms frame: 160, or 960 for Opus."""
        return self.clock_rate_hz // 50

    @property
    def remote_on_hold(self) -> bool:
        """The peer put us on hold (RFC 3264 §8.4, or legacy c=0.0.0.0)."""
        return self.remote_direction in ("sendonly", "inactive") or self.remote_addr is None


@lru_cache(maxsize=64)
def parse_sdp(text: str) -> SessionDescription:
    """Parse an SDP body (memoised: the result is frozen, and one offer is read by the
    user agent's admission check and again by the shell that answers it).

    Raises:
        SdpError: missing v/o/m essentials, bad numbers, too many lines.
    """
    lines = [line.rstrip("\r") for line in text.split("\n") if line.strip()]
    if len(lines) > MAX_SDP_LINES:
        raise SdpError("too many SDP lines")
    if not lines or lines[0] != "v=0":
        raise SdpError("SDP must start with v=0")
    session: dict[str, str] = {}
    session_direction: Direction | None = None
    blocks: list[list[str]] = []
    for line in lines[1:]:
        kind, eq, value = line.partition("=")
        if not eq or len(kind) != 1:
            raise SdpError("malformed SDP line")
        if kind == "m":
            if len(blocks) >= MAX_MEDIA_LINES:
                raise SdpError("too many m= lines")
            blocks.append([value])
        elif blocks:
            blocks[-1].append(line)
        elif kind == "a" and value in _DIRECTIONS:
            session_direction = _direction(value)
        elif kind in "oct":
            session.setdefault(kind, value)
    if "o" not in session:
        raise SdpError("missing o= line")
    return SessionDescription(
        origin=_parse_origin(session["o"]),
        connection=_parse_connection(session["c"]) if "c" in session else None,
        direction=session_direction,
        media=tuple(_parse_media(block) for block in blocks),
        timing=session.get("t", "0 0"),
    )


def _direction(value: str) -> Direction:
    for direction in _DIRECTIONS:
        if direction == value:
            return direction
    raise SdpError("bad direction")


def _parse_origin(value: str) -> Origin:
    parts = value.split()
    if len(parts) != 6 or not ascii_digits(parts[2]) or len(parts[2]) > 20:
        raise SdpError("malformed o= line")
    return Origin(parts[0], parts[1], int(parts[2]), parts[4], parts[5])


def _parse_connection(value: str) -> str:
    parts = value.split()
    if len(parts) != 3 or parts[0] != "IN" or parts[1] not in ("IP4", "IP6"):
        raise SdpError("malformed c= line")
    return parts[2].split("/")[0]  # drop a multicast TTL suffix


def _int(text: str, limit: int, what: str) -> int:
    if not ascii_digits(text) or len(text) > 10 or int(text) > limit:
        raise SdpError(f"bad {what}")
    return int(text)


def _parse_media(block: list[str]) -> MediaDescription:
    parts = block[0].split()
    if len(parts) < 4:
        raise SdpError("malformed m= line")
    media, port_text, proto, *formats = parts
    port = _int(port_text.split("/")[0], 65535, "m= port")
    connection = None
    rtpmap: list[tuple[int, str, int]] = []
    fmtp: list[tuple[int, str]] = []
    ptime = rtcp = None
    direction: Direction | None = None
    rtcp_mux = False
    crypto: list[SdesCrypto] = []
    for line in block[1:]:
        kind, value = line[0], line[2:]
        if kind == "c":
            connection = _parse_connection(value)
            continue
        if kind != "a":
            continue
        name, _, arg = value.partition(":")
        if name == "rtpmap":
            pt, _, codec = arg.partition(" ")
            encoding, _, rate = codec.partition("/")
            rtpmap.append(
                (
                    _int(pt, 127, "payload type"),
                    encoding,
                    _int(rate.split("/")[0], 10**6, "clock rate"),
                )
            )
        elif name == "fmtp":
            pt, _, params = arg.partition(" ")
            fmtp.append((_int(pt, 127, "payload type"), params.strip()))
        elif name == "ptime":
            ptime = _int(arg.strip().split(".")[0], 1000, "ptime")
        elif name == "rtcp":
            rtcp = _int(arg.split()[0] if arg.split() else "", 65535, "rtcp port")
        elif name == "rtcp-mux":
            rtcp_mux = True
        elif name == "crypto":
            # a suite we do not have, or a malformed line: not offered to us
            with contextlib.suppress(SdpError):
                crypto.append(SdesCrypto.parse(arg))
        elif name in _DIRECTIONS:
            direction = _direction(name)
    return MediaDescription(
        media, port, proto, tuple(formats), connection, tuple(rtpmap), tuple(fmtp),
        ptime, direction, rtcp, rtcp_mux, tuple(crypto),
    )  # fmt: skip


def _codec_of(media: MediaDescription, fmt: str) -> tuple[int, str, int] | None:
    if not ascii_digits(fmt) or int(fmt) > 127:
        return None
    pt = int(fmt)
    for mapped_pt, encoding, rate in media.rtpmap:
        if mapped_pt == pt:
            return pt, encoding.upper(), rate
    if pt in STATIC_PAYLOAD_TYPES:
        return pt, STATIC_PAYLOAD_TYPES[pt], CLOCK_RATE_HZ
    return None


def negotiate(sdp: SessionDescription, codecs: Sequence[str]) -> NegotiatedAudio | None:
    """Choose the audio stream and codec from an offer (or from an answer to ours):
    ``RTP/AVP`` or ``RTP/SAVP``, the latter's crypto kept (``srtp_refusal`` decides).

    Args:
        sdp: the remote description.
        codecs: our preference order, e.g. ``("PCMU", "PCMA")``.

    Returns:
        The negotiated stream, or None when nothing is acceptable (answer 488).
    """
    for index, media in enumerate(sdp.media):
        if media.media != "audio" or media.port == 0 or media.proto not in _PROFILES:
            continue
        offered = [c for c in (_codec_of(media, f) for f in media.formats) if c is not None]
        chosen = _choose(offered, codecs)
        if chosen is None:
            continue
        codec = _CODEC_NAMES[chosen[1]]
        clock_hz = CLOCK_RATES_HZ[codec]
        # RFC 4733 §2.1: the events' clock is the audio's (an Opus call with only
        # telephone-event/8000 on offer gets none, and in-band DTMF detection)
        events = [pt for pt, enc, rate in offered if enc == "TELEPHONE-EVENT" and rate == clock_hz]
        connection = media.connection or sdp.connection
        if connection is None:
            continue
        held = connection in ("0.0.0.0", "::")
        opus = None
        if codec == "OPUS":
            fmtp = [params for pt, params in media.fmtp if pt == chosen[0]]
            opus = OpusParams.parse(fmtp[0]) if fmtp else OpusParams()
        return NegotiatedAudio(
            media_index=index,
            codec=codec,
            payload_type=chosen[0],
            telephone_event_pt=events[0] if events else None,
            remote_addr=None if held else (connection, media.port),
            remote_direction=media.direction or sdp.direction or "sendrecv",
            ptime_ms=media.ptime_ms or PTIME_MS,
            proto=media.proto,
            crypto=media.crypto,
            clock_rate_hz=clock_hz,
            opus=opus,
        )
    return None


_PROFILES = ("RTP/AVP", "RTP/SAVP")
_CODEC_NAMES: Final[dict[str, Codec]] = {name: name for name in CODECS}


def srtp_refusal(audio: NegotiatedAudio, transport: str, srtp: str) -> str | None:
    """Why an offered stream cannot be taken (answered 488), or None if it can.

    ``transport``: the SIP transport the offer came over (``UDP``, ``TCP``, ``TLS``);
    ``srtp``: ``off``, ``offer`` or ``require``. SDES keys are readable by anyone
    who sees the SIP, so they are taken only over TLS (RFC 4568, security considerations)."""
    if audio.crypto and transport.upper() != "TLS":
        return "SDES keys (a=crypto) are taken over TLS only"
    if audio.proto == "RTP/SAVP" and not audio.crypto:
        return "RTP/SAVP without a supported crypto suite"
    if audio.proto == "RTP/SAVP" and srtp == "off":
        return "SRTP is off here"
    if srtp == "require" and not audio.crypto:
        return "SRTP is required here"
    return None


def _choose(
    offered: list[tuple[int, str, int]], codecs: Sequence[str]
) -> tuple[int, str, int] | None:
    for wanted in codecs:
        if wanted.upper() not in _CODEC_NAMES:
            continue  # not one we can speak
        name = _CODEC_NAMES[wanted.upper()]
        for codec in offered:
            if codec[1] == name and codec[2] == CLOCK_RATES_HZ[name]:
                return codec
    return None


def answer_direction(offered: Direction, wanted: Direction = "sendrecv") -> Direction:
    """RFC 3264 §6.1: what we may answer to ``offered`` given what we ``wanted``."""
    we_send = offered in ("sendrecv", "recvonly") and wanted in ("sendrecv", "sendonly")
    we_receive = offered in ("sendrecv", "sendonly") and wanted in ("sendrecv", "recvonly")
    if we_send and we_receive:
        return "sendrecv"
    if we_send:
        return "sendonly"
    return "recvonly" if we_receive else "inactive"


def _session_lines(address: str, session_id: int, version: int, timing: str) -> list[str]:
    family = "IP6" if ":" in address else "IP4"
    return [
        "v=0",
        f"o=- {session_id} {version} IN {family} {address}",
        "s=-",
        f"c=IN {family} {address}",
        f"t={timing}",
    ]


def _audio_lines(
    port: int,
    codec_pts: Sequence[tuple[int, Codec]],
    events: Sequence[tuple[int, int]],
    direction: Direction,
    crypto: Sequence[SdesCrypto] = (),
    proto: str = "",
) -> list[str]:
    """``events``: (payload type, clock rate) of each telephone-event."""
    formats = [str(pt) for pt, _ in codec_pts] + [str(pt) for pt, _ in events]
    proto = proto or ("RTP/SAVP" if crypto else "RTP/AVP")
    lines = [f"m=audio {port} {proto} {' '.join(formats)}"]
    lines += [f"a={c.to_attribute()}" for c in crypto]
    for pt, name in codec_pts:
        if name == "OPUS":  # RFC 7587 §7: always opus/48000/2, mono or not
            lines += [f"a=rtpmap:{pt} opus/48000/2", f"a=fmtp:{pt} {OPUS_FMTP}"]
        else:
            lines.append(f"a=rtpmap:{pt} {name}/{CLOCK_RATE_HZ}")
    for pt, rate in events:
        lines += [f"a=rtpmap:{pt} telephone-event/{rate}", f"a=fmtp:{pt} 0-16"]
    lines += [f"a=ptime:{PTIME_MS}", f"a={direction}"]
    return lines


def build_answer(
    offer: SessionDescription,
    audio: NegotiatedAudio,
    address: str,
    port: int,
    session_id: int,
    version: int,
    wanted: Direction = "sendrecv",
    crypto: SdesCrypto | None = None,
) -> str:
    """The answer to ``offer``: same m= lines in the same order, ours for the audio
    with our ``a=crypto`` when ``crypto`` (``choose_crypto``), in the offer's profile
    (``RTP/SAVP``, or ``RTP/AVP`` for a best-effort offer)."""
    lines = _session_lines(address, session_id, version, offer.timing)
    direction = answer_direction(audio.remote_direction, wanted)
    for index, media in enumerate(offer.media):
        if index == audio.media_index:
            codec = [(audio.payload_type, audio.codec)]
            keys = (crypto,) if crypto else ()
            te = audio.telephone_event_pt
            events = [(te, audio.clock_rate_hz)] if te is not None else []
            lines += _audio_lines(port, codec, events, direction, keys, audio.proto)
        else:
            lines.append(f"m={media.media} 0 {media.proto} {' '.join(media.formats)}")
    return "\r\n".join(lines) + "\r\n"


def build_offer(
    address: str,
    port: int,
    session_id: int,
    version: int,
    codecs: Sequence[str] = ("PCMU", "PCMA"),
    telephone_event_pt: int | None = 101,
    direction: Direction = "sendrecv",
    crypto: Sequence[SdesCrypto] = (),
    proto: str = "",
) -> str:
    """An audio offer for an outbound call (static payload types 0/8/9, Opus at 111);
    ``RTP/SAVP`` with one ``a=crypto`` per key when ``crypto`` is given
    (``proto="RTP/AVP"`` with ``crypto``: best-effort SRTP, a peer without it answers
    plain RTP). telephone-event is offered at each clock the codecs use, as common
    implementations do: ``/8000`` at ``telephone_event_pt`` beside G.711 or G.722,
    ``/48000`` at ``OPUS_EVENT_PT`` beside Opus."""
    codec_pts = [(PAYLOAD_TYPES[n], n) for n in (_CODEC_NAMES.get(c) for c in codecs) if n]
    events: list[tuple[int, int]] = []
    if telephone_event_pt is not None:
        rates = sorted({CLOCK_RATES_HZ[name] for _, name in codec_pts})
        events = [(telephone_event_pt if r == CLOCK_RATE_HZ else OPUS_EVENT_PT, r) for r in rates]
    lines = _session_lines(address, session_id, version, "0 0")
    lines += _audio_lines(port, codec_pts, events, direction, crypto, proto)
    return "\r\n".join(lines) + "\r\n"
