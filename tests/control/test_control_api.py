"""The HTTP API handlers and their OpenAPI document, against a fake call directory."""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from control_jsonschema import errors

from bridge.commands import Answer, Command, Reject, Say, SendDtmf, Transfer
from bridge.control.api import (
    MAX_BODY_BYTES,
    REFUSALS,
    ROUTES,
    ApiResponse,
    CallInfo,
    DirectoryError,
    call_path,
    handle,
    openapi,
)

TOKEN = "s3cret-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
JSON_AUTH = {**AUTH, "Content-Type": "application/json"}
ROOT = Path(__file__).resolve().parents[2]
DOC = openapi()

ALICE = CallInfo(
    "c-1", "sip", "inbound", "sip:alice@127.0.0.1", "sip:bot@127.0.0.1", "active", 12.3456, "flow"
)
BOB = CallInfo("c-2", "twilio", "inbound", "+15550001111", "+15550002222", "ringing", 0.5)


@dataclass
class FakeDirectory:
    calls: dict[str, CallInfo] = field(default_factory=lambda: {"c-1": ALICE, "c-2": BOB})
    ending: set[str] = field(default_factory=set)
    said: list[tuple[str, Say]] = field(default_factory=list)
    hung_up: list[tuple[str, str]] = field(default_factory=list)
    originated: list[tuple[str, str, str]] = field(default_factory=list)
    full: bool = False
    trunks: list[str] = field(default_factory=list)
    commands: list[tuple[str, Command]] = field(default_factory=list)
    early: set[str] = field(default_factory=lambda: {"c-1"})
    """Calls in early media (``answer`` and ``reject`` are refused on the others)."""

    def list_calls(self) -> Sequence[CallInfo]:
        return list(self.calls.values())

    def get_call(self, call_id: str) -> CallInfo | None:
        return self.calls.get(call_id)

    def originate(self, to: str, from_: str, route: str, trunk: str = "") -> str | DirectoryError:
        if trunk == "busy":
            return DirectoryError(429, "trunk_rate_limited", "over the rate", "trunk", 0.25)
        if trunk:
            self.trunks.append(trunk)
        if self.full:
            return DirectoryError(503, "no_capacity", "max_calls reached")
        if route == "nowhere":
            return DirectoryError(422, "no_route", "no route matches", "route")
        self.originated.append((to, from_, route))
        return "c-9"

    def mint_stream_token(self, call_id: str) -> tuple[str, float] | DirectoryError:
        return f"v1.1.n.{call_id}", 30.0

    def _check(self, call_id: str) -> DirectoryError | None:
        if call_id not in self.calls:
            return DirectoryError(404, "no_such_call", f"no call {call_id}", "call_id")
        if call_id in self.ending:
            return DirectoryError(409, "call_ending", "the call is ending")
        return None

    def say(self, call_id: str, say: Say) -> DirectoryError | None:
        err = self._check(call_id)
        if err is None:
            self.said.append((call_id, say))
        return err

    def hangup(self, call_id: str, reason: str) -> DirectoryError | None:
        err = self._check(call_id)
        if err is None:
            self.hung_up.append((call_id, reason))
        return err

    def command(self, call_id: str, command: Command) -> DirectoryError | None:
        """As the daemon's: the call's refusal reason through ``REFUSALS``."""
        err = self._check(call_id)
        if err is not None:
            return err
        reason = ""
        if isinstance(command, Answer | Reject) and call_id not in self.early:
            reason = "not_early_media"
        elif isinstance(command, Transfer) and command.trunk not in ("", "carrier"):
            reason = "unknown_trunk"
        if reason:
            status, field = REFUSALS[reason]
            return DirectoryError(status, reason, f"the call refused it: {reason}", field)
        self.commands.append((call_id, command))
        return None


def call(
    method: str,
    path: str,
    body: Any = None,
    headers: dict[str, str] | None = None,
    directory: FakeDirectory | None = None,
    token: str = TOKEN,
) -> tuple[ApiResponse, Any]:
    raw = body if isinstance(body, bytes) else b"" if body is None else json.dumps(body).encode()
    hdrs = JSON_AUTH if headers is None else headers
    resp = handle(method, path, hdrs, raw, directory or FakeDirectory(), token)
    assert dict(resp.headers)["Content-Type"] == "application/json"
    return resp, json.loads(resp.body)


def assert_error(resp: ApiResponse, body: Any, status: int, field: str | None = None) -> None:
    assert resp.status == status, body
    assert errors(body, {"$ref": "#/components/schemas/Error"}, DOC) == []
    if field is not None:
        assert body["error"].get("field") == field, body


# ------------------------------------------------------------ handlers


def test_list_and_get_calls() -> None:
    resp, body = call("GET", "/v1/calls")
    assert resp.status == 200
    assert [c["call_id"] for c in body["calls"]] == ["c-1", "c-2"]
    assert body["calls"][0] == {
        "call_id": "c-1",
        "leg": "sip",
        "direction": "inbound",
        "from": "sip:alice@127.0.0.1",
        "to": "sip:bot@127.0.0.1",
        "state": "active",
        "duration_s": 12.346,
        "turn_source": "flow",
    }
    resp, body = call("GET", "/v1/calls/c-2?verbose=1")
    assert resp.status == 200 and body["state"] == "ringing"
    resp, body = call("GET", "/v1/calls/c-404")
    assert_error(resp, body, 404, "call_id")
    resp, body = call("GET", "/v1/calls/bad%20id")
    assert_error(resp, body, 404, "call_id")


def test_a_sip_call_id_is_a_path_segment_percent_encoded_where_it_must_be() -> None:
    """SIP Call-IDs hold ``@`` (nearly all) and may hold ``/`` or ``?`` (RFC 3261
    ``word``): ``call_path`` encodes what a segment cannot hold and the router decodes it,
    so every call is reachable; what is not a Call-ID is 404 naming the field."""
    odd = 'a/b?c%"<x>@[::1]'
    d = FakeDirectory()
    for call_id in ("3848276298220188511@127.0.0.1", odd):
        d.calls[call_id] = dataclasses.replace(ALICE, call_id=call_id)
        path = f"/v1/calls/{call_path(call_id)}"
        resp, body = call("GET", path, headers=AUTH, directory=d)
        assert resp.status == 200 and body["call_id"] == call_id
        assert call("POST", f"{path}/hangup", None, headers=AUTH, directory=d)[0].status == 202
    assert call_path(odd) == "a%2Fb%3Fc%25%22%3Cx%3E@%5B::1%5D"
    assert [c for c, _ in d.hung_up] == ["3848276298220188511@127.0.0.1", odd]
    for bad in ("a%20b", "x@y@z", "a" * 257):
        assert_error(*call("GET", f"/v1/calls/{bad}", headers=AUTH, directory=d), 404, "call_id")


def test_originate() -> None:
    d = FakeDirectory()
    resp, body = call("POST", "/v1/calls", {"to": "sip:carol@127.0.0.1:5070"}, directory=d)
    assert resp.status == 201
    assert body == {"call_id": "c-9", "url": "/v1/calls/c-9"}
    assert ("Location", "/v1/calls/c-9") in resp.headers
    resp, _ = call(
        "POST",
        "/v1/calls",
        {"to": "tel:+15551234567", "from": "sip:bot@example.com", "route": "sales"},
        directory=d,
    )
    assert resp.status == 201
    assert d.originated == [
        ("sip:carol@127.0.0.1:5070", "", ""),
        ("tel:+15551234567", "sip:bot@example.com", "sales"),
    ]
    assert_error(*call("POST", "/v1/calls", {"to": "carol"}), 422, "to")
    assert_error(*call("POST", "/v1/calls", {"from": "sip:x@y"}), 422, "to")
    assert_error(*call("POST", "/v1/calls", {"to": "sip:a@b", "cc": 1}), 422, "cc")
    assert_error(*call("POST", "/v1/calls", {"to": "sip:a@b", "route": "nowhere"}), 422, "route")
    full = FakeDirectory(full=True)
    assert_error(*call("POST", "/v1/calls", {"to": "sip:a@b"}, directory=full), 503)


def test_originate_names_a_trunk_and_a_rate_refusal_says_when_to_retry() -> None:
    d = FakeDirectory()
    resp, _ = call("POST", "/v1/calls", {"to": "tel:+15551234567", "trunk": "tw-1"}, directory=d)
    assert resp.status == 201
    assert d.trunks == ["tw-1"]
    resp, body = call("POST", "/v1/calls", {"to": "tel:+15551234567", "trunk": "busy"})
    assert_error(resp, body, 429, "trunk")
    assert body["error"]["code"] == "trunk_rate_limited"
    assert ("Retry-After", "1") in resp.headers
    assert_error(*call("POST", "/v1/calls", {"to": "sip:a@b", "trunk": "a b"}), 422, "trunk")


def test_say_with_and_without_turn_id() -> None:
    d = FakeDirectory()
    resp, body = call("POST", "/v1/calls/c-1/say", {"text": "Hello", "turn_id": "t1"}, directory=d)
    assert resp.status == 202 and body == {"call_id": "c-1", "turn_id": "t1"}
    resp, body = call(
        "POST",
        "/v1/calls/c-1/say",
        {"text": "Now!", "replace": True, "interruptible": False, "voice": "joe"},
        directory=d,
    )
    assert resp.status == 202
    assert re.fullmatch(r"api-[0-9a-f]{12}", body["turn_id"])
    assert d.said == [
        ("c-1", Say("t1", "Hello")),
        ("c-1", Say(body["turn_id"], "Now!", interruptible=False, replace=True, voice="joe")),
    ]


def test_say_refusals_name_the_field() -> None:
    path = "/v1/calls/c-1/say"
    assert_error(*call("POST", path, {}), 422, "text")
    assert_error(*call("POST", path, {"text": 5}), 422, "text")
    assert_error(*call("POST", path, {"text": "x" * 4097}), 422, "text")
    assert_error(*call("POST", path, {"text": "x", "final": "yes"}), 422, "final")
    assert_error(*call("POST", path, {"text": "x", "type": "say"}), 422, "type")
    assert_error(*call("POST", path, {"text": "x", "turn_id": "a b"}), 422, "turn_id")
    assert_error(*call("POST", path, None), 422, "$")
    assert_error(*call("POST", path, ["text"]), 422, "$")
    assert_error(*call("POST", path, b"{not json"), 400, "$")
    assert_error(*call("POST", path, b'{"text": NaN}'), 400, "$")
    assert_error(*call("POST", path, b'{"text": "a", "text": "b"}'), 422, "text")
    assert_error(*call("POST", "/v1/calls/c-7/say", {"text": "x"}), 404, "call_id")
    d = FakeDirectory(ending={"c-1"})
    assert_error(*call("POST", path, {"text": "x"}, directory=d), 409)
    assert d.said == []


def test_hangup_with_and_without_body() -> None:
    d = FakeDirectory()
    resp, body = call("POST", "/v1/calls/c-1/hangup", None, headers=AUTH, directory=d)
    assert resp.status == 202 and body == {"call_id": "c-1"}
    resp, _ = call("POST", "/v1/calls/c-2/hangup", {"reason": "operator"}, directory=d)
    assert resp.status == 202
    assert d.hung_up == [("c-1", "api_hangup"), ("c-2", "operator")]
    assert_error(*call("POST", "/v1/calls/c-3/hangup", {}), 404)
    assert_error(*call("POST", "/v1/calls/c-1/hangup", {"reason": ""}), 422, "reason")


def test_the_app_protocols_call_commands_have_paths() -> None:
    """answer, reject, transfer and dtmf: the application protocol's fields and rules;
    the call's refusals come back as 409 or 422 with its reason as the code."""
    d = FakeDirectory()
    assert call("POST", "/v1/calls/c-1/answer", None, headers=AUTH, directory=d)[0].status == 202
    assert call("POST", "/v1/calls/c-1/reject", {"status": 480}, directory=d)[0].status == 202
    assert call("POST", "/v1/calls/c-1/reject", None, headers=AUTH, directory=d)[0].status == 202
    body = {"target": "tel:+15551234567", "trunk": "carrier"}
    assert call("POST", "/v1/calls/c-2/transfer", body, directory=d)[0].status == 202
    assert call("POST", "/v1/calls/c-2/dtmf", {"digits": "1#"}, directory=d)[0].status == 202
    assert d.commands == [
        ("c-1", Answer()),
        ("c-1", Reject(480, "")),
        ("c-1", Reject(486, "")),
        ("c-2", Transfer("tel:+15551234567", "carrier")),
        ("c-2", SendDtmf("1#")),
    ]
    resp, err = call("POST", "/v1/calls/c-2/answer", None, headers=AUTH, directory=d)
    assert resp.status == 409 and err["error"]["code"] == "not_early_media"
    resp, err = call("POST", "/v1/calls/c-2/transfer", {**body, "trunk": "ghost"}, directory=d)
    assert resp.status == 422 and err["error"] == {
        "code": "unknown_trunk",
        "message": "the call refused it: unknown_trunk",
        "field": "trunk",
    }
    assert_error(*call("POST", "/v1/calls/c-1/reject", {"status": 200}, directory=d), 422, "status")
    assert_error(*call("POST", "/v1/calls/c-1/transfer", {}, directory=d), 422, "target")
    assert_error(*call("POST", "/v1/calls/c-1/dtmf", {"digits": "x"}, directory=d), 422, "digits")
    assert_error(*call("POST", "/v1/calls/c-1/answer", {"status": 1}, directory=d), 422, "status")
    assert_error(*call("POST", "/v1/calls/c-3/answer", None, headers=AUTH), 404)
    assert len(d.commands) == 5


def test_media_type_and_size() -> None:
    path = "/v1/calls/c-1/say"
    assert_error(*call("POST", path, {"text": "x"}, headers=AUTH), 415)
    text_plain = {**AUTH, "Content-Type": "text/plain"}
    assert_error(*call("POST", path, {"text": "x"}, headers=text_plain), 415)
    charset = {**AUTH, "content-type": "Application/JSON; charset=utf-8"}
    assert call("POST", path, {"text": "x"}, headers=charset)[0].status == 202
    big = b'{"text":"' + b"a" * MAX_BODY_BYTES + b'"}'
    assert_error(*call("POST", path, big), 413)


def test_auth() -> None:
    for headers in (
        {},
        {"Authorization": "Bearer wrong"},
        {"Authorization": f"Basic {TOKEN}"},
        {"Authorization": TOKEN},
        {"Authorization": f"Bearer {TOKEN}x"},
    ):
        resp, body = call("GET", "/v1/calls", headers=headers)
        assert_error(resp, body, 401)
        challenge = dict(resp.headers)["WWW-Authenticate"]
        assert challenge.startswith("Bearer")
        assert ("invalid_token" in challenge) == bool(headers)
    assert call("GET", "/v1/calls", headers={"authorization": f"bearer {TOKEN}"})[0].status == 200
    # No token configured (loopback only): no authentication.
    assert call("GET", "/v1/calls", headers={}, token="")[0].status == 200
    # The document is public.
    assert call("GET", "/openapi.json", headers={})[0].status == 200


def test_unknown_paths_and_methods() -> None:
    for path in ("/", "/v1", "/v1/calls/", "/v1/calls/c-1/say/x", "/v2/calls", "/healthz"):
        assert_error(*call("GET", path), 404)
    resp, body = call("DELETE", "/v1/calls/c-1")
    assert_error(resp, body, 405)
    assert dict(resp.headers)["Allow"] == "GET"
    resp, _ = call("PUT", "/v1/calls")
    assert resp.status == 405 and dict(resp.headers)["Allow"] == "GET, POST"


def test_openapi_route_serves_the_document() -> None:
    resp, body = call("GET", "/openapi.json")
    assert resp.status == 200
    assert body == json.loads(json.dumps(DOC))


# ------------------------------------------------------------ the document


METHODS = ("get", "post", "put", "patch", "delete", "head", "options")
VALID_BODIES = {
    ("/v1/calls", "post"): {"to": "sip:carol@127.0.0.1"},
    ("/v1/calls/{call_id}/say", "post"): {"text": "Hello"},
    ("/v1/calls/{call_id}/hangup", "post"): {"reason": "done"},
    ("/v1/calls/{call_id}/answer", "post"): {},
    ("/v1/calls/{call_id}/reject", "post"): {"status": 603},
    ("/v1/calls/{call_id}/transfer", "post"): {"target": "tel:+15551234567"},
    ("/v1/calls/{call_id}/dtmf", "post"): {"digits": "12#"},
    ("/v1/stream-tokens", "post"): {"call_id": "v3:telnyx-call"},
}


def operations() -> list[tuple[str, str, dict[str, Any]]]:
    return [
        (path, method, op)
        for path, item in DOC["paths"].items()
        for method, op in item.items()
        if method in METHODS
    ]


def concrete(template: str) -> str:
    return template.replace("{call_id}", "c-1")


def check_response(op: dict[str, Any], resp: ApiResponse) -> None:
    documented = op["responses"].get(str(resp.status))
    assert documented is not None, (op["operationId"], resp.status, resp.body)
    if "$ref" in documented:
        documented = DOC["components"]["responses"][documented["$ref"].split("/")[-1]]
    schema = documented["content"]["application/json"]["schema"]
    assert errors(json.loads(resp.body), schema, DOC) == [], (op["operationId"], resp.body)


def test_document_is_openapi_31_with_unique_operation_ids() -> None:
    assert DOC["openapi"] == "3.1.0"
    ids = [op["operationId"] for _, _, op in operations()]
    assert len(ids) == len(set(ids)) == 11


def test_document_and_routes_agree_both_ways() -> None:
    documented = {(p, m.upper()) for p, m, _ in operations()}
    routed = {(template, method) for template, methods in ROUTES for method in methods}
    assert documented == routed


@pytest.mark.parametrize(("path", "method"), [(p, m) for p, m, _ in operations()])
def test_every_documented_operation_answers_as_documented(path: str, method: str) -> None:
    op = DOC["paths"][path][method]
    body = VALID_BODIES.get((path, method))
    if "requestBody" in op:
        schema = op["requestBody"]["content"]["application/json"]["schema"]
        assert errors(body, schema, DOC) == []
    resp, _ = call(method.upper(), concrete(path), body)
    assert 200 <= resp.status < 300
    check_response(op, resp)
    # Every refusal it gives is documented too.
    if op.get("security") != []:
        check_response(op, call(method.upper(), concrete(path), body, headers={})[0])
    if "parameters" in DOC["paths"][path]:
        check_response(op, call(method.upper(), path.replace("{call_id}", "c-404"), body)[0])
    if "requestBody" in op:
        for bad in (b"{", b"[]", b'{"zzz": 1}', b"x" * (MAX_BODY_BYTES + 1)):
            check_response(op, call(method.upper(), concrete(path), bad)[0])
        check_response(op, call(method.upper(), concrete(path), body, headers=AUTH)[0])


@pytest.mark.parametrize("path", list(DOC["paths"]))
def test_undocumented_methods_are_405(path: str) -> None:
    item = DOC["paths"][path]
    for method in METHODS:
        if method not in item:
            resp, _ = call(method.upper(), concrete(path))
            assert resp.status == 405, (path, method)
            assert dict(resp.headers)["Allow"] == ", ".join(
                sorted(m.upper() for m in item if m in METHODS)
            )


def test_documented_request_schemas_match_the_handlers() -> None:
    say = DOC["components"]["schemas"]["SayRequest"]
    assert say["required"] == ["text"]
    assert errors({"text": "x", "turn_id": "t 1"}, say, DOC) != []
    resp, _ = call("POST", "/v1/calls/c-1/say", {"text": "x", "turn_id": "t 1"})
    assert resp.status == 422
    assert errors({"text": "x", "replace": True}, say, DOC) == []


def test_http_api_doc_names_every_route() -> None:
    text = (ROOT / "docs/http-api.md").read_text()
    for path, method, _ in operations():
        assert f"{method.upper()} {path}" in text, (method, path)
