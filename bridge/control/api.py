"""The HTTP API: pure request handlers over the daemon's directory of calls.

Theory of operation
-------------------
``handle(method, path, headers, body, directory, token)`` answers one HTTP
request with an ``ApiResponse`` (status, JSON body, headers). It does no I/O:
the lead's HTTP listener (``bridge/io/httpws.py``) reads the request, calls
``handle`` for every path under ``/v1/`` and for ``/openapi.json``, and writes
the response; ``/healthz``, ``/readyz`` and ``/metrics`` are the listener's.
What the handlers act on is a ``CallDirectory`` the shell provides: it lists
and finds calls, originates a SIP call, and feeds ``Say`` / hang-up commands
to a call's bridge (the same ``Command`` values an application sends).

Routes (``ROUTES``, and the OpenAPI 3.1 document ``openapi()`` describes
exactly these)::

    GET  /v1/calls                  200 {"calls": [CallInfo...]}
    POST /v1/calls                  201 {"call_id", "url"}  (originate over SIP)
    GET  /v1/calls/{call_id}        200 CallInfo
    POST /v1/calls/{call_id}/say    202 {"call_id", "turn_id"}
    POST /v1/calls/{call_id}/hangup 202 {"call_id"}
    POST /v1/calls/{call_id}/{answer,reject,transfer,dtmf}
                                    202 {"call_id"}  (the application protocol's commands)
    POST /v1/stream-tokens          201 {"token", "expires_in_s"}  (a media stream's
                                        single-use token, for the carrier's call id)
    GET  /openapi.json              200 the OpenAPI document (no token needed)

Request checks, in order: unknown path 404; a configured ``token`` missing or
wrong 401 with ``WWW-Authenticate: Bearer`` (compared in constant time);
method not allowed 405 with ``Allow``; body over ``MAX_BODY_BYTES`` 413; a
body that is not ``Content-Type: application/json`` 415; JSON that does not
parse 400; a body that is not an object, has unknown fields or a bad field
422 naming the field. Every error body is
``{"error": {"code", "message", "field"?}}``. The directory's own refusals
(no such call 404, call over 409, no capacity 503, ...) come back as
``DirectoryError`` values and are passed through with their status; a
command the call refuses (``answer`` outside early media, a ``transfer`` naming
no configured trunk) is 409 or 422 with the call's reason as ``error.code``.

Rules that keep this module honest:

1. No request raises: every input maps to a status. (An exception from the
   directory is the shell's bug and propagates to the listener's 500.)
2. Field rules are the application protocol's (``bridge.control.app``), so a
   ``say`` means the same on both.
"""

from __future__ import annotations

import dataclasses
import hmac
import json
import math
import re
import secrets
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from bridge import __version__
from bridge.commands import Command, Say
from bridge.control.app import COMMAND_BUILDERS, COMMAND_FIELDS, FieldSpec

__all__ = [
    "API_COMMANDS",
    "MAX_BODY_BYTES",
    "REFUSALS",
    "ROUTES",
    "ApiResponse",
    "CallDirectory",
    "CallInfo",
    "DirectoryError",
    "authorized",
    "call_path",
    "handle",
    "openapi",
]

MAX_BODY_BYTES = 64 * 1024
_CALLID_WORD = r"[A-Za-z0-9.!%*_+`'~()<>:\\\"/\[\]?{}-]{1,256}"
CALL_ID_RE = rf"{_CALLID_WORD}(?:@{_CALLID_WORD})?"
"""A call id in a path: a SIP Call-ID (RFC 3261 ``callid = word ["@" word]``, each word
at most 256 characters) or a media stream's (``STREAM_CALL_ID_RE``). A client
percent-encodes what a path segment cannot hold (``/``, ``?``, ``%``...); ``@`` and
``:`` may go as they are."""
STREAM_CALL_ID_RE = r"[A-Za-z0-9._:-]{1,128}"
"""A media stream's call id as the API and a stream token take it (the leg cuts the
carrier's id to this)."""
_URI = r"(sips?|tel):[!-~]{1,250}"
_URI_HINT = "a sip:, sips: or tel: URI (printable ASCII, no spaces, at most 254 characters)"


# ---------------------------------------------------------------- the shell's side


@dataclass(frozen=True, slots=True)
class CallInfo:
    """What the API shows of one call."""

    call_id: str
    leg: str
    direction: Literal["inbound", "outbound"]
    from_: str
    to: str
    state: Literal["ringing", "early_media", "active", "ending"]
    """``ringing``/``early_media``: an outbound call not answered yet (``early_media``: the
    far end sent 183 with SDP, its ringback or announcement is flowing)."""
    duration_s: float
    turn_source: str = ""
    """``app``, ``flow``, ``voice_agent`` or ``""`` (driven by the API only)."""

    def to_json(self) -> dict[str, Any]:
        return {
            "call_id": self.call_id,
            "leg": self.leg,
            "direction": self.direction,
            "from": self.from_,
            "to": self.to,
            "state": self.state,
            "duration_s": round(self.duration_s, 3),
            "turn_source": self.turn_source,
        }


@dataclass(frozen=True, slots=True)
class DirectoryError:
    """The directory refused: ``status`` is the HTTP status to answer with."""

    status: int
    code: str
    message: str
    field: str = ""
    retry_after_s: float = 0.0
    """When above 0: a ``Retry-After`` header (whole seconds, rounded up)."""


class CallDirectory(Protocol):
    """What the shell provides to the handlers (all calls return at once).

    Refusals are ``DirectoryError`` values with the status the OpenAPI
    document lists: ``originate`` 422 (no route for it, field ``to``,
    ``route`` or ``trunk``), 429 (the trunk's ``calls_per_second``) or 503 (SIP
    disabled, no capacity, the trunk's ``max_calls``); ``say`` and ``hangup`` 404
    (no such call) or 409 (the call is ending, the turn's text is closed).
    """

    def list_calls(self) -> Sequence[CallInfo]: ...

    def get_call(self, call_id: str) -> CallInfo | None: ...

    def originate(self, to: str, from_: str, route: str, trunk: str = "") -> str | DirectoryError:
        """Place a SIP call to ``to``; ``route`` ("" = match on ``to``) picks its route,
        ``trunk`` ("" = none, or for a ``tel:`` target the only one) its trunk."""
        ...

    def say(self, call_id: str, say: Say) -> DirectoryError | None:
        """``CallBridge.execute(say)`` on the call."""
        ...

    def hangup(self, call_id: str, reason: str) -> DirectoryError | None:
        """``CallBridge.execute(Hangup(reason))`` on the call."""
        ...

    def command(self, call_id: str, command: Command) -> DirectoryError | None:
        """``CallBridge.execute(command)`` on the call (``Answer``, ``Reject``,
        ``Transfer``, ``SendDtmf``); the call's refusal (its ``CommandRejected``) comes
        back as a ``DirectoryError`` (``REFUSALS``)."""
        ...

    def mint_stream_token(self, call_id: str) -> tuple[str, float] | DirectoryError:
        """A single-use media-stream token for the carrier's ``call_id`` and its lifetime
        in seconds; 409 when ``[media_streams] single_use_tokens`` is off."""
        ...


@dataclass(frozen=True, slots=True)
class ApiResponse:
    status: int
    body: bytes
    headers: tuple[tuple[str, str], ...] = (("Content-Type", "application/json"),)


# ---------------------------------------------------------------- plumbing


@dataclass(frozen=True, slots=True)
class _Request:
    headers: Mapping[str, str]
    body: bytes
    params: dict[str, str]
    directory: CallDirectory


class _Refused(Exception):
    def __init__(self, status: int, code: str, message: str, field: str = "") -> None:
        super().__init__(message)
        self.response = _error(status, code, message, field)


def _json(status: int, obj: object, *extra: tuple[str, str]) -> ApiResponse:
    body = json.dumps(obj, separators=(",", ":")).encode()
    return ApiResponse(status, body, (("Content-Type", "application/json"), *extra))


def _error(
    status: int, code: str, message: str, field: str = "", *extra: tuple[str, str]
) -> ApiResponse:
    err: dict[str, str] = {"code": code, "message": message}
    if field:
        err["field"] = field
    return _json(status, {"error": err}, *extra)


def _from_directory(err: DirectoryError) -> ApiResponse:
    extra = (("Retry-After", str(math.ceil(err.retry_after_s))),) if err.retry_after_s > 0 else ()
    return _error(err.status, err.code, err.message, err.field, *extra)


def _body(req: _Request, fields: Sequence[FieldSpec], required: bool) -> dict[str, Any]:
    """The validated JSON object of the body (``{}`` for an empty optional body)."""
    if not req.body.strip():
        if required:
            raise _Refused(422, "invalid_body", "a JSON object is required", "$")
        return {}
    ctype = req.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if ctype != "application/json":
        raise _Refused(415, "unsupported_media_type", "send Content-Type: application/json")
    try:
        obj = json.loads(req.body, object_pairs_hook=_no_duplicates, parse_constant=_no_constant)
    except (ValueError, RecursionError) as e:
        raise _Refused(400, "invalid_json", f"not JSON: {e}", "$") from None
    if not isinstance(obj, dict):
        raise _Refused(422, "invalid_body", "expected a JSON object", "$")
    known = {f.name: f for f in fields}
    for key in obj:
        if key not in known:
            raise _Refused(422, "invalid_field", "unknown field", key)
    for spec in fields:
        if spec.name in obj:
            problem = spec.check(obj[spec.name])
            if problem is not None:
                raise _Refused(422, "invalid_field", problem, spec.name)
        elif spec.required:
            raise _Refused(422, "invalid_field", "missing", spec.name)
    return obj


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        dup = next(k for i, (k, _) in enumerate(pairs) if k in dict(pairs[:i]))
        raise _Refused(422, "invalid_field", "duplicate key", dup)
    return out


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


# ---------------------------------------------------------------- handlers

_SAY_FIELDS = tuple(
    dataclasses.replace(f, required=False) if f.name == "turn_id" else f
    for f in COMMAND_FIELDS["say"]
)
_HANGUP_FIELDS = COMMAND_FIELDS["hangup"]
_STREAM_TOKEN_FIELDS = (
    FieldSpec(
        "call_id", "str", True, STREAM_CALL_ID_RE,
        hint="the call id the carrier sends in start (1-128 of A-Z a-z 0-9 . _ : -)",
    ),
)  # fmt: skip
_ORIGINATE_FIELDS = (
    FieldSpec("to", "str", True, _URI, hint=_URI_HINT),
    FieldSpec("from", "str", False, _URI, hint=_URI_HINT),
    FieldSpec("route", "str", False, r"[ -~]{1,128}", hint="1-128 printable ASCII characters"),
    FieldSpec("trunk", "str", False, r"[A-Za-z0-9_.-]{1,64}", hint="a [trunks] name"),
)


def _list_calls(req: _Request) -> ApiResponse:
    return _json(200, {"calls": [c.to_json() for c in req.directory.list_calls()]})


def _get_call(req: _Request) -> ApiResponse:
    info = req.directory.get_call(req.params["call_id"])
    if info is None:
        return _no_such_call(req.params["call_id"])
    return _json(200, info.to_json())


def _originate(req: _Request) -> ApiResponse:
    body = _body(req, _ORIGINATE_FIELDS, required=True)
    result = req.directory.originate(
        body["to"], body.get("from", ""), body.get("route", ""), body.get("trunk", "")
    )
    if isinstance(result, DirectoryError):
        return _from_directory(result)
    url = f"/v1/calls/{call_path(result)}"
    return _json(201, {"call_id": result, "url": url}, ("Location", url))


def _say(req: _Request) -> ApiResponse:
    call_id = req.params["call_id"]
    body = _body(req, _SAY_FIELDS, required=True)
    turn_id = body.get("turn_id") or f"api-{secrets.token_hex(6)}"
    say = Say(
        turn_id,
        body["text"],
        final=body.get("final", True),
        interruptible=body.get("interruptible", True),
        replace=body.get("replace", False),
        provider=body.get("provider"),
        voice=body.get("voice"),
        cacheable=body.get("cacheable", False),
    )
    err = req.directory.say(call_id, say)
    if err is not None:
        return _from_directory(err)
    return _json(202, {"call_id": call_id, "turn_id": turn_id})


def _hangup(req: _Request) -> ApiResponse:
    call_id = req.params["call_id"]
    body = _body(req, _HANGUP_FIELDS, required=False)
    err = req.directory.hangup(call_id, body.get("reason", "api_hangup"))
    if err is not None:
        return _from_directory(err)
    return _json(202, {"call_id": call_id})


REFUSALS: dict[str, tuple[int, str]] = {
    "not_early_media": (409, "$"),
    "call_ended": (409, "$"),
    "transfer_unsupported": (409, "$"),
    "dtmf_unsupported": (409, "$"),
    "unknown_trunk": (422, "trunk"),
    "empty_target": (422, "target"),
    "bad_digits": (422, "digits"),
    "bad_status": (422, "status"),
}
"""A call's ``CommandRejected`` reason -> (status, field) of the API's error."""


def _command(kind: str) -> _Handler:
    """The handler of ``POST /v1/calls/{call_id}/<kind>``: the application protocol's
    command of that name (its fields, rules and refusals)."""
    fields = COMMAND_FIELDS[kind]
    required = _body_required(kind)

    def handler(req: _Request) -> ApiResponse:
        call_id = req.params["call_id"]
        body = _body(req, fields, required=required)
        err = req.directory.command(call_id, COMMAND_BUILDERS[kind](body))
        if err is not None:
            return _from_directory(err)
        return _json(202, {"call_id": call_id})

    return handler


_COMMAND_TEXT = {
    "answer": (
        "Answer a SIP call in early media (200 OK after the 183)",
        "no fields; 409 not_early_media when the call is not in early media",
    ),
    "reject": (
        "Refuse a SIP call in early media with a final status",
        "status: 400-699 (486 by default); reason: the status line's text",
    ),
    "transfer": (
        "Blind transfer of the caller (SIP REFER)",
        "target: a sip:, sips: or tel: URI; trunk: the [trunks] entry a tel: target goes "
        "through (default: the call's own trunk); 422 unknown_trunk for another name; "
        "409 transfer_unsupported on a media-stream call",
    ),
    "dtmf": (
        "Send DTMF digits on the call",
        "digits: 1-32 of 0-9 * # A B C D; 409 dtmf_unsupported on a media stream whose "
        "carrier protocol has no DTMF message",
    ),
}
"""Each API command's (summary, request description) in the OpenAPI document."""

API_COMMANDS = tuple(_COMMAND_TEXT)
"""The application protocol's commands that have a path of their own on a call."""


def _body_required(kind: str) -> bool:
    """Whether the application command ``kind`` has a required field (then a body)."""
    return any(f.required for f in COMMAND_FIELDS[kind])


def _stream_token(req: _Request) -> ApiResponse:
    body = _body(req, _STREAM_TOKEN_FIELDS, required=True)
    result = req.directory.mint_stream_token(body["call_id"])
    if isinstance(result, DirectoryError):
        return _from_directory(result)
    token, ttl_s = result
    return _json(201, {"token": token, "expires_in_s": ttl_s})


def _openapi(req: _Request) -> ApiResponse:
    return _json(200, openapi())


def _no_such_call(call_id: str) -> ApiResponse:
    return _error(404, "no_such_call", f"no call {call_id[:128]!r}", "call_id")


_Handler = Callable[[_Request], ApiResponse]

ROUTES: tuple[tuple[str, dict[str, _Handler]], ...] = (
    ("/v1/calls", {"GET": _list_calls, "POST": _originate}),
    ("/v1/calls/{call_id}", {"GET": _get_call}),
    ("/v1/calls/{call_id}/say", {"POST": _say}),
    ("/v1/calls/{call_id}/hangup", {"POST": _hangup}),
    *((f"/v1/calls/{{call_id}}/{kind}", {"POST": _command(kind)}) for kind in API_COMMANDS),
    ("/v1/stream-tokens", {"POST": _stream_token}),
    ("/openapi.json", {"GET": _openapi}),
)
"""(path template, {method: handler}); ``openapi()`` documents exactly these."""

PUBLIC = frozenset({"/openapi.json"})


def call_path(call_id: str) -> str:
    """``call_id`` as a path segment of ``/v1/calls/{call_id}`` (percent-encoded)."""
    return urllib.parse.quote(call_id, safe="@:")


def _compile(template: str) -> re.Pattern[str]:
    parts = re.split(r"\{(\w+)\}", template)
    rx = "".join(re.escape(p) if i % 2 == 0 else f"(?P<{p}>[^/]+)" for i, p in enumerate(parts))
    return re.compile(rx)


_COMPILED = tuple((template, _compile(template), methods) for template, methods in ROUTES)


def _route(path: str) -> tuple[str, dict[str, str], dict[str, _Handler]] | None:
    for template, rx, methods in _COMPILED:
        m = rx.fullmatch(path)
        if m is not None:  # a segment is percent-decoded (a Call-ID may hold / or ?)
            params = {k: urllib.parse.unquote(v) for k, v in m.groupdict().items()}
            return template, params, methods
    return None


def authorized(headers: Mapping[str, str], token: str) -> bool:
    """Whether ``headers`` carry ``Authorization: Bearer <token>`` (anything goes without one)."""
    if not token:
        return True
    scheme, _, given = headers.get("authorization", "").strip().partition(" ")
    if scheme.lower() != "bearer":
        return False
    return hmac.compare_digest(given.strip().encode("utf-8", "surrogatepass"), token.encode())


def handle(
    method: str,
    path: str,
    headers: Mapping[str, str],
    body: bytes,
    directory: CallDirectory,
    token: str,
) -> ApiResponse:
    """Answer one HTTP request.

    Args:
        method: the request method (``GET``, ``POST``...).
        path: the request target; a query string is ignored.
        headers: request headers; names in any case.
        body: the request body (the listener bounds it; over ``MAX_BODY_BYTES`` is 413).
        directory: the shell's calls.
        token: ``api.token`` from the config; "" means no authentication
            (the config allows that on loopback only).

    Returns:
        The response to write; its body is always JSON.
    """
    lower = {k.lower(): v for k, v in headers.items()}
    found = _route(path.split("?", 1)[0])
    if found is None:
        return _error(404, "not_found", "no such resource")
    template, params, methods = found
    if template not in PUBLIC and not authorized(lower, token):
        challenge = 'Bearer realm="callbridge"'
        if "authorization" in lower:
            challenge += ', error="invalid_token"'
        return _error(401, "unauthorized", "a valid bearer token is required", "",
                      ("WWW-Authenticate", challenge))  # fmt: skip
    handler = methods.get(method.upper())
    if handler is None:
        allow = ", ".join(sorted(methods))
        return _error(405, "method_not_allowed", f"allowed: {allow}", "", ("Allow", allow))
    if "call_id" in params and re.fullmatch(CALL_ID_RE, params["call_id"]) is None:
        return _no_such_call(params["call_id"])
    if len(body) > MAX_BODY_BYTES:
        return _error(413, "body_too_large", f"the body is over {MAX_BODY_BYTES} bytes")
    try:
        return handler(_Request(lower, body, params, directory))
    except _Refused as refused:
        return refused.response


# ---------------------------------------------------------------- OpenAPI


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _str(pattern: str = "", description: str = "", **kw: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"type": "string", **kw}
    if pattern:
        out["pattern"] = f"^{pattern}$"
    if description:
        out["description"] = description
    return out


def _field_schema(spec: FieldSpec) -> dict[str, Any]:
    if spec.kind == "bool":
        return {"type": "boolean"}
    if spec.kind == "int":
        return {"type": "integer", "minimum": spec.lo, "maximum": spec.hi}
    extra: dict[str, Any] = {"maxLength": spec.max_chars} if spec.max_chars else {}
    return _str(spec.pattern, spec.hint, **extra)


def _object(fields: Sequence[FieldSpec], description: str) -> dict[str, Any]:
    return {
        "type": "object",
        "description": description,
        "properties": {f.name: _field_schema(f) for f in fields},
        "required": [f.name for f in fields if f.required],
        "additionalProperties": False,
    }


def _closed(properties: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": properties,
        "required": list(properties),
        "additionalProperties": False,
    }


def _schemas() -> dict[str, Any]:
    call_info = _closed(
        {
            "call_id": _str(CALL_ID_RE),
            "leg": _str(description="sip, twilio, telnyx, plivo, exotel, vonage or webrtc"),
            "direction": {"enum": ["inbound", "outbound"]},
            "from": _str(),
            "to": _str(),
            "state": {"enum": ["ringing", "early_media", "active", "ending"]},
            "duration_s": {"type": "number", "minimum": 0},
            "turn_source": {"enum": ["app", "flow", "voice_agent", ""]},
        }
    )
    error = _closed(
        {"code": _str(), "message": _str(), "field": _str(description="the field at fault")}
    )
    error["required"] = ["code", "message"]
    return {
        "CallInfo": call_info,
        "CallList": _closed({"calls": {"type": "array", "items": _ref("CallInfo")}}),
        "Error": _closed({"error": error}),
        "OriginateRequest": _object(
            _ORIGINATE_FIELDS,
            "route: the key matched against routes; trunk: the [trunks] entry the call goes "
            "through (a tel: target takes the only trunk when there is one)",
        ),
        "OriginateResponse": _closed({"call_id": _str(CALL_ID_RE), "url": _str()}),
        "SayRequest": _object(
            _SAY_FIELDS, "as the application protocol's say; turn_id is generated when absent"
        ),
        "SayResponse": _closed({"call_id": _str(CALL_ID_RE), "turn_id": _str()}),
        "HangupRequest": _object(_HANGUP_FIELDS, "reason defaults to api_hangup"),
        "HangupResponse": _closed({"call_id": _str(CALL_ID_RE)}),
        **{
            f"{kind.capitalize()}Request": _object(COMMAND_FIELDS[kind], _COMMAND_TEXT[kind][1])
            for kind in API_COMMANDS
        },
        "CommandResponse": _closed({"call_id": _str(CALL_ID_RE)}),
        "StreamTokenRequest": _object(
            _STREAM_TOKEN_FIELDS, "the carrier's call id the token is bound to"
        ),
        "StreamTokenResponse": _closed(
            {"token": _str(), "expires_in_s": {"type": "number", "minimum": 1}}
        ),
    }


def _responses(ok: int, ok_schema: str, *errors: int) -> dict[str, Any]:
    out: dict[str, Any] = {
        str(ok): {
            "description": "success",
            "content": {"application/json": {"schema": _ref(ok_schema)}},
        }
    }
    for status in errors:
        out[str(status)] = {"$ref": f"#/components/responses/E{status}"}
    return out


_ERROR_TEXT = {
    400: "the body is not JSON",
    401: "missing or wrong bearer token",
    404: "no such call",
    409: "the call cannot do that now (ending, turn closed), or single-use tokens are off",
    413: "the body is too large",
    415: "the body is not application/json",
    422: "a field is missing, unknown or invalid (error.field names it)",
    429: "the trunk's calls_per_second is reached (Retry-After: seconds to wait)",
    503: "no capacity or SIP not enabled",
}

_CALL_ID_PARAM = {
    "name": "call_id",
    "in": "path",
    "required": True,
    "schema": _str(CALL_ID_RE),
}


def _body_spec(schema: str, required: bool) -> dict[str, Any]:
    return {
        "required": required,
        "content": {"application/json": {"schema": _ref(schema)}},
    }


def _paths() -> dict[str, Any]:
    body_errors = (400, 401, 413, 415, 422)
    return {
        "/v1/calls": {
            "get": {
                "operationId": "listCalls",
                "summary": "The calls in progress on this node",
                "responses": _responses(200, "CallList", 401),
            },
            "post": {
                "operationId": "originateCall",
                "summary": "Place an outbound SIP call; its route decides what drives it",
                "requestBody": _body_spec("OriginateRequest", True),
                "responses": _responses(201, "OriginateResponse", *body_errors, 429, 503),
            },
        },
        "/v1/calls/{call_id}": {
            "parameters": [_CALL_ID_PARAM],
            "get": {
                "operationId": "getCall",
                "summary": "One call",
                "responses": _responses(200, "CallInfo", 401, 404),
            },
        },
        "/v1/calls/{call_id}/say": {
            "parameters": [_CALL_ID_PARAM],
            "post": {
                "operationId": "sayOnCall",
                "summary": "Speak text on the call (queued behind the current turn)",
                "requestBody": _body_spec("SayRequest", True),
                "responses": _responses(202, "SayResponse", *body_errors, 404, 409),
            },
        },
        "/v1/calls/{call_id}/hangup": {
            "parameters": [_CALL_ID_PARAM],
            "post": {
                "operationId": "hangupCall",
                "summary": "End the call",
                "requestBody": _body_spec("HangupRequest", False),
                "responses": _responses(202, "HangupResponse", *body_errors, 404, 409),
            },
        },
        **{
            f"/v1/calls/{{call_id}}/{kind}": {
                "parameters": [_CALL_ID_PARAM],
                "post": {
                    "operationId": f"{kind}Call",
                    "summary": _COMMAND_TEXT[kind][0],
                    "requestBody": _body_spec(f"{kind.capitalize()}Request", _body_required(kind)),
                    "responses": _responses(202, "CommandResponse", *body_errors, 404, 409),
                },
            }
            for kind in API_COMMANDS
        },
        "/v1/stream-tokens": {
            "post": {
                "operationId": "mintStreamToken",
                "summary": "A single-use token for a media stream (custom parameter 'token')",
                "requestBody": _body_spec("StreamTokenRequest", True),
                "responses": _responses(201, "StreamTokenResponse", *body_errors, 409),
            },
        },
        "/openapi.json": {
            "get": {
                "operationId": "getOpenApi",
                "summary": "This document",
                "security": [],
                "responses": {
                    "200": {
                        "description": "the OpenAPI document",
                        "content": {"application/json": {"schema": {"type": "object"}}},
                    }
                },
            }
        },
    }


def openapi() -> dict[str, Any]:
    """The OpenAPI 3.1 document of ``ROUTES`` (served at ``/openapi.json``)."""
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "callbridge HTTP API",
            "version": __version__,
            "description": "Calls in progress on one callbridge node. See docs/http-api.md.",
        },
        "security": [{"bearer": []}],
        "paths": _paths(),
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "schemas": _schemas(),
            "responses": {
                f"E{status}": {
                    "description": text,
                    "content": {"application/json": {"schema": _ref("Error")}},
                }
                for status, text in _ERROR_TEXT.items()
            },
        },
    }
