"""Destinations parsed from SIP URIs: ASCII ports in range only (issue 33)."""

from __future__ import annotations

from bridge.io.legs.sip import _uri_hostport


def test_ports_are_ascii_digits_in_range() -> None:
    assert _uri_hostport("sip:bob@192.0.2.1:5070") == ("192.0.2.1", 5070)
    assert _uri_hostport("<sips:[2001:db8::1]:5061>") == ("2001:db8::1", 5061)
    assert _uri_hostport("sip:192.0.2.1") == ("192.0.2.1", 5060)
    # a port past 65535 made sendto raise OverflowError in the UA pump
    assert _uri_hostport("sip:bob@192.0.2.1:99999") is None
    # \d took Arabic-Indic digits as a port
    assert _uri_hostport("sip:bob@192.0.2.1:٥٠٦٠") is None
    assert _uri_hostport("sip:bob@192.0.2.1:5060;transport=udp") == ("192.0.2.1", 5060)
