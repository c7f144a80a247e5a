"""Parser and serialiser tests, RFC 4475-style cases written for this project."""

from __future__ import annotations

from pathlib import Path

import pytest

from bridge.sip.errors import SipParseError
from bridge.sip.message import (
    MAX_HEADERS,
    MAX_MESSAGE_BYTES,
    SipRequest,
    SipResponse,
    build_response,
    can_answer,
    parse_message,
    parse_via,
)
from bridge.sip.uri import parse_name_addr, parse_params, parse_uri, split_list

FIXTURES = Path(__file__).parent / "fixtures"


def load(name: str) -> bytes:
    """Fixture files are stored with LF line ends; the wire uses CRLF."""
    return (FIXTURES / name).read_bytes().replace(b"\n", b"\r\n")


def parse_request(name: str) -> SipRequest:
    message = parse_message(load(name))
    assert isinstance(message, SipRequest)
    return message


# --- 3.1.1 valid messages ----------------------------------------------------


def test_tortuous_invite_parses_every_field() -> None:
    req = parse_request("valid_tortuous.txt")
    assert req.method == "INVITE"
    assert req.request_uri().user == "bob.smith"
    assert req.request_uri().has_param("unknownparam")
    assert req.to().tag == "7a9f01"
    sender = req.from_()
    assert sender.display_name == 'Caller "the" \\Tester\\'
    assert sender.tag == "88sja8x"
    assert req.get("max-forwards") == "0070"
    assert req.cseq().number == 9 and req.cseq().method == "INVITE"
    vias = req.vias()
    assert [v.transport for v in vias] == ["UDP", "TCP"]
    assert vias[0].branch == "z9hG4bKtortuous1"
    assert vias[1].host == "spindle.example.com" and vias[1].received == "192.0.2.55"
    assert req.get("NEWFANGLEDHEADER") == "newfangled value continued newfangled value"
    assert req.get("subject") == ""
    (contact,) = req.contacts()
    assert contact.display_name == 'Quoted string ""'
    assert contact.param("newparam") == "newvalue"
    assert contact.param("secondparam") == ""
    assert contact.param("q") == "0.33"
    assert req.body.startswith(b"v=0\r\n") and len(req.body) == 121
    route = parse_name_addr(req.get_all("route")[0])
    assert route.uri.has_param("lr") and route.uri.param("unknownwith") == "value"


def test_escapes_are_decoded_in_user_part() -> None:
    req = parse_request("valid_escapes.txt")
    uri = req.request_uri()
    assert uri.user_unescaped == "sip:user@example.com"
    assert uri.host == "atlanta.example.com" and uri.param("ttl") == "15"
    assert req.to().uri.user_unescaped == "alice"


def test_escaped_nul_is_not_a_terminator() -> None:
    req = parse_request("valid_escaped_nul.txt")
    assert req.to().uri.user_unescaped == "null-\x00-user"
    users = [c.uri.user_unescaped for c in req.contacts()]
    assert users == ["\x00", "\x00\x00"]


def test_percent_that_is_not_an_escape_is_literal() -> None:
    req = parse_request("valid_percent_not_escape.txt")
    assert req.method == "RE%47IST%45R"  # an unknown method, not REGISTER
    assert req.to().display_name == "%Z%45"
    # "C%6Fntact" is an unknown header, not Contact.
    assert len(req.contacts()) == 2
    assert req.get("c%6fntact") == "<sip:alias2@host2.example.com>"


def test_no_space_between_display_name_and_bracket() -> None:
    req = parse_request("valid_no_lws_display.txt")
    assert req.from_().display_name == "caller"
    assert req.from_().uri.user == "caller"


def test_semicolon_in_user_part() -> None:
    req = parse_request("valid_semicolon_user.txt")
    uri = req.request_uri()
    assert uri.user == "user;par=u%40example.net"
    assert uri.host == "example.com" and uri.params == ()
    assert "message/sipfrag" in req.get_all("accept")
    assert len(req.get_all("accept")) == 6


def test_unknown_transports_in_via() -> None:
    req = parse_request("valid_transports.txt")
    assert [v.transport for v in req.vias()] == ["UDP", "SCTP", "TLS", "UNKNOWN", "TCP"]


def test_utf8_and_empty_reason_phrases() -> None:
    unusual = parse_message(load("valid_unusual_reason.txt"))
    assert isinstance(unusual, SipResponse)
    assert unusual.status == 200 and "простое" in unusual.reason
    empty = parse_message(load("valid_empty_reason.txt"))
    assert isinstance(empty, SipResponse)
    assert empty.status == 100 and empty.reason == ""


def test_ipv6_references() -> None:
    req = parse_request("valid_ipv6.txt")
    assert req.request_uri().host == "2001:db8::10"
    vias = req.vias()
    assert vias[0].host == "2001:db8::9:1" and vias[0].received == "[2001:db8::9:255]"
    assert vias[1].port == 5070
    assert req.contacts()[0].uri.host_port == "[2001:db8::1]:5060"


def test_rfc2543_message_body_is_rest_of_datagram() -> None:
    req = parse_request("valid_rfc2543.txt")
    assert req.get("content-length") is None
    assert req.body.endswith(b"m=audio 30000 RTP/AVP 0\r\n")
    assert req.from_().tag is None
    assert req.top_via().branch is None


def test_octets_after_content_length_are_ignored_on_datagrams() -> None:
    data = load("valid_escapes.txt") + b"garbage that is not part of the message"
    req = parse_message(data)
    assert req.body == b""


def test_long_values_and_many_vias() -> None:
    base = load("valid_escapes.txt").decode()
    extra = "".join(
        f"Via: SIP/2.0/UDP relay{i}.example.com;branch=z9hG4bK{i}\r\n" for i in range(40)
    )
    long_header = "X-Long: " + "v" * 4000 + "\r\n"
    text = base.replace("Content-Length: 0\r\n", extra + long_header + "Content-Length: 0\r\n")
    req = parse_message(text.encode())
    assert len(req.vias()) == 41
    assert req.get("x-long") == "v" * 4000


def test_multipart_body_framed_by_content_length() -> None:
    body = (
        b"--boundary42\r\nContent-Type: application/sdp\r\n\r\nv=0\r\n"
        b"--boundary42\r\nContent-Type: application/octet-stream\r\n\r\n\x00\x01\xff\r\n"
        b"--boundary42--\r\n"
    )
    head = (
        load("valid_escapes.txt")
        .decode()
        .replace(
            "Content-Length: 0",
            f"Content-Type: multipart/mixed;boundary=boundary42\r\nContent-Length: {len(body)}",
        )
    )
    req = parse_message(head.encode() + body + b"trailing")
    assert req.body == body


# --- 3.1.2 invalid messages --------------------------------------------------

ANSWERED_WITH = {
    "invalid_extra_separators.txt": (400, "empty parameter"),
    "invalid_content_length_too_large.txt": (400, "Content-Length larger than message"),
    "invalid_negative_content_length.txt": (400, "negative Content-Length"),
    "invalid_cseq_overflow.txt": (400, "CSeq number out of range"),
    "invalid_expires_overflow.txt": (400, "Expires out of range"),
    "invalid_max_forwards_overflow.txt": (400, "Max-Forwards out of range"),
    "invalid_unterminated_quote.txt": (400, "unterminated quoted string"),
    "invalid_brackets_around_ruri.txt": (400, "bad Request-URI: URI without scheme"),
    "invalid_lws_in_ruri.txt": (400, "malformed request line"),
    "invalid_extra_spaces_request_line.txt": (400, "malformed request line"),
    "invalid_trailing_space_request_line.txt": (400, "malformed request line"),
    "invalid_headers_in_ruri.txt": (400, "headers in Request-URI"),
    "invalid_contact_needs_brackets.txt": (400, "addr-spec with reserved characters needs <>"),
    "invalid_space_in_addr_spec.txt": (400, "addr-spec with reserved characters needs <>"),
    "invalid_display_name.txt": (400, "display name is not a token or quoted string"),
    "invalid_version.txt": (505, "Version Not Supported"),
    "invalid_cseq_method_mismatch.txt": (400, "CSeq method does not match request method"),
    "invalid_unknown_method_mismatch.txt": (400, "CSeq method does not match request method"),
    "invalid_multiple_content_length.txt": (400, "multiple Content-Length headers"),
    "invalid_multiple_single_valued.txt": (400, "multiple Call-ID headers"),
    "invalid_ipv6_without_brackets.txt": (400, "IPv6 address without brackets"),
}
DROPPED = [
    "invalid_broken_top_via.txt",  # no parseable top Via: nowhere to answer
    "invalid_response_overlarge_scalars.txt",
    "invalid_response_big_code.txt",
    "invalid_missing_headers.txt",
]


@pytest.mark.parametrize(("name", "expected"), sorted(ANSWERED_WITH.items()))
def test_invalid_requests_are_answerable_with_precise_reason(
    name: str, expected: tuple[int, str]
) -> None:
    with pytest.raises(SipParseError) as info:
        parse_message(load(name))
    assert (info.value.status, info.value.reason) == expected
    assert can_answer(info.value.partial)


@pytest.mark.parametrize("name", DROPPED)
def test_invalid_unanswerable_messages_are_dropped(name: str) -> None:
    with pytest.raises(SipParseError) as info:
        parse_message(load(name))
    assert not can_answer(info.value.partial)


def test_ack_is_never_answerable() -> None:
    text = load("valid_escapes.txt").replace(b"INVITE", b"ACK").replace(b"ACK sip:", b"ACK sip:", 1)
    bad = text.replace(b"Max-Forwards: 70", b"Max-Forwards: 999")
    with pytest.raises(SipParseError) as info:
        parse_message(bad)
    assert not can_answer(info.value.partial)


def test_limits() -> None:
    with pytest.raises(SipParseError) as info:
        parse_message(b"x" * (MAX_MESSAGE_BYTES + 1))
    assert info.value.status == 513
    many = "".join(f"X-H{i}: v\r\n" for i in range(MAX_HEADERS + 1))
    text = (
        load("valid_escapes.txt").decode().replace("Content-Length: 0", many + "Content-Length: 0")
    )
    with pytest.raises(SipParseError, match="too many headers"):
        parse_message(text.encode())


# --- URIs, Via, serialisation ------------------------------------------------


def test_uri_forms() -> None:
    uri = parse_uri("sips:alice:secret@[2001:db8::5]:5061;transport=tls;lr?subject=x")
    assert (uri.scheme, uri.user, uri.password, uri.host, uri.port) == (
        "sips",
        "alice",
        "secret",
        "2001:db8::5",
        5061,
    )
    assert uri.param("transport") == "tls" and uri.has_param("lr") and uri.headers == "subject=x"
    assert str(uri) == "sips:alice:secret@[2001:db8::5]:5061;transport=tls;lr?subject=x"
    tel = parse_uri("tel:+1-201-555-0123;phone-context=example.com")
    assert tel.user == "+1-201-555-0123" and tel.param("phone-context") == "example.com"
    other = parse_uri("soap.beep://192.0.2.1:3002")
    assert other.scheme == "soap.beep" and not other.is_sip
    for bad in ("sip:host:99999", "sip:[2001:db8::1", "nocolon", "sip:bad host"):
        with pytest.raises(SipParseError):
            parse_uri(bad)


def test_via_rport_received_and_roundtrip() -> None:
    via = parse_via("SIP/2.0/UDP 192.0.2.1:5060;rport;branch=z9hG4bKx")
    assert via.rport == "" and via.branch == "z9hG4bKx"
    filled = via.with_param("rport", "40000").with_param("received", "198.51.100.7")
    assert str(filled) == (
        "SIP/2.0/UDP 192.0.2.1:5060;rport=40000;branch=z9hG4bKx;received=198.51.100.7"
    )
    assert parse_via(str(filled)) == filled


def test_build_response_and_serialise_roundtrip() -> None:
    req = parse_request("valid_tortuous.txt")
    resp = build_response(req, 180, "Ringing", to_tag="ignored-because-present")
    assert resp.to().tag == "7a9f01"
    again = parse_message(resp.to_bytes())
    assert isinstance(again, SipResponse)
    assert again.status == 180 and again.call_id == req.call_id
    assert [v.branch for v in again.vias()] == [v.branch for v in req.vias()]
    assert again.get("content-length") == "0"
    req2 = parse_message(req.to_bytes())
    assert isinstance(req2, SipRequest) and req2.body == req.body
    assert req2.cseq() == req.cseq()


def test_header_set_replaces_all_lines() -> None:
    req = parse_request("valid_transports.txt")
    req.set("via", "SIP/2.0/UDP only.example.com;branch=z9hG4bKone")
    assert [v.host for v in req.vias()] == ["only.example.com"]
    req.remove("v")
    assert req.get("via") is None


def test_list_splitting_shortcuts_match_the_quote_aware_scan() -> None:
    # no separator, or no quotes/brackets: the splits are str operations
    assert split_list("  one  ") == ["one"]
    assert split_list(" \t ") == []
    assert split_list(" a ,, b ,") == ["a", "b"]
    assert split_list('"x, y" <sip:a@b>') == ['"x, y" <sip:a@b>']
    assert split_list('<sip:a@b;p="1,2">, b') == ['<sip:a@b;p="1,2">', "b"]
    assert split_list('"a\\"b", c') == ['"a\\"b"', "c"]
    for unterminated in ('"open', 'ok "open', '"closed" "open'):
        with pytest.raises(SipParseError, match="unterminated"):
            split_list(unterminated)
    assert parse_params(";a=1;;b".replace(";;", ";x;")) == (("a", "1"), ("x", None), ("b", None))
    with pytest.raises(SipParseError, match="bad value"):
        parse_params(";a=b c")


def test_parsers_are_memoised_but_errors_are_not() -> None:
    value = '"Bob" <sip:bob@example.com>;tag=99'
    assert parse_name_addr(value) is parse_name_addr(value)  # frozen result, shared
    for _ in range(2):
        with pytest.raises(SipParseError):
            parse_name_addr("<sip:bob@example.com")
        with pytest.raises(SipParseError):
            parse_via("SIP/2.0/UDP host:99999")
