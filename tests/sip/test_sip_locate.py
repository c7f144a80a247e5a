"""RFC 3263 server location, the pure part (``bridge.sip.locate``): which queries, in
which order, what their answers mean; RFC 2782's order with a chosen random draw."""

from __future__ import annotations

import random

import pytest

from bridge.sip.locate import (
    Located,
    LookupPlan,
    SrvQuery,
    SrvRecord,
    TtlCache,
    choose_srv,
    dns_server_address,
    expand,
    order_srv,
    plan_lookup,
)


def _never(a: int, b: int) -> int:
    raise AssertionError("no draw expected")


def test_a_numeric_host_or_an_explicit_port_is_looked_up_by_address_only() -> None:
    assert plan_lookup("192.0.2.1", None) == LookupPlan("192.0.2.1", (), 5060, "UDP")
    assert plan_lookup("[2001:db8::1]", None, "sips") == LookupPlan("2001:db8::1", (), 5061, "TLS")
    assert plan_lookup("example.com", 5070) == LookupPlan("example.com", (), 5070, "UDP")
    assert plan_lookup("example.com", 5070, "sip", "tcp").transport == "TCP"
    # RFC 6761: localhost is never asked of DNS
    assert plan_lookup("localhost", None).srv == ()
    assert plan_lookup("a.localhost", None).srv == ()


def test_a_name_without_port_asks_srv_per_transport() -> None:
    plan = plan_lookup("example.com", None)
    assert plan.srv == (
        SrvQuery("_sip._udp.example.com", "UDP"),
        SrvQuery("_sip._tcp.example.com", "TCP"),
        SrvQuery("_sips._tcp.example.com", "TLS"),
    )
    assert (plan.port, plan.transport) == (5060, "UDP")
    # only the transports this node sends on
    plan = plan_lookup("example.com.", None, supported=("UDP",))
    assert plan.srv == (SrvQuery("_sip._udp.example.com", "UDP"),)
    # a transport named in the URI, or sips:, asks for that one only
    assert plan_lookup("example.com", None, "sip", "TCP").srv == (
        SrvQuery("_sip._tcp.example.com", "TCP"),
    )
    tls = plan_lookup("example.com", None, "sip", "tls")
    assert tls.srv == (SrvQuery("_sips._tcp.example.com", "TLS"),)
    assert (tls.port, tls.transport) == (5061, "TLS")
    assert plan_lookup("example.com", None, "sips").srv == tls.srv


def test_priority_first_then_weight() -> None:
    records = [
        SrvRecord(20, 0, 5062, "c.example.com"),
        SrvRecord(10, 60, 5060, "a.example.com"),
        SrvRecord(10, 40, 5061, "b.example.com"),
    ]
    # the draw over [0, 100]: up to 60 picks a (running sum 60), above picks b
    assert [r.target for r in order_srv(records, lambda a, b: 60)] == [
        "a.example.com",
        "b.example.com",
        "c.example.com",
    ]
    assert [r.target for r in order_srv(records, lambda a, b: 61)][:2] == [
        "b.example.com",
        "a.example.com",
    ]


def test_draws_follow_the_weights_and_weight_zero_is_rarely_first() -> None:
    records = [
        SrvRecord(0, 0, 1, "zero"),
        SrvRecord(0, 1, 2, "one"),
        SrvRecord(0, 3, 3, "three"),
    ]
    rng = random.Random(7)
    firsts: dict[str, int] = {}
    for _ in range(4000):
        first = order_srv(records, rng.randint)[0].target
        firsts[first] = firsts.get(first, 0) + 1
    # expected shares: zero 1/5 (a draw of 0), one 1/5, three 3/5
    assert 600 < firsts["zero"] < 1000
    assert 600 < firsts["one"] < 1000
    assert 2200 < firsts["three"] < 2600


def test_all_weights_zero_needs_no_draw_and_dot_means_not_offered() -> None:
    records = [SrvRecord(1, 0, 1, "x"), SrvRecord(1, 0, 2, "y")]
    assert [r.target for r in order_srv(records, _never)] == ["x", "y"]
    assert order_srv([SrvRecord(0, 0, 0, ".")], _never) == []


def test_the_first_query_with_records_wins_else_the_host() -> None:
    plan = plan_lookup("example.com", None)
    udp_not_offered = [SrvRecord(0, 0, 0, ".")]
    tcp = [SrvRecord(5, 0, 5070, "sip1.example.com")]
    chosen = choose_srv(plan, [udp_not_offered, tcp, None], _never)
    assert chosen == ("TCP", tcp)
    assert choose_srv(plan, [None, [], None], _never) is None
    assert choose_srv(plan, [], _never) is None


def test_targets_expand_to_their_addresses_in_order_once_each() -> None:
    records = [SrvRecord(0, 0, 5070, "a.test"), SrvRecord(1, 0, 5070, "b.test")]
    addresses = {"a.test": ["192.0.2.1", "192.0.2.2"], "b.test": ["192.0.2.1"], "c": []}
    got = expand("UDP", records, lambda name: addresses.get(name, []))
    assert got == [
        Located("192.0.2.1", 5070, "UDP", "a.test"),
        Located("192.0.2.2", 5070, "UDP", "a.test"),
    ]


def test_ttl_cache_expires_and_stays_bounded() -> None:
    cache: TtlCache[str, int] = TtlCache(max_entries=3)
    cache.put("a", 1, now=0.0, ttl_s=10.0)
    assert cache.get("a", 9.9) == 1
    assert cache.get("a", 10.0) is None and len(cache) == 0
    cache.put("zero", 0, now=0.0, ttl_s=0.0)  # a TTL of 0: not kept
    assert cache.get("zero", 0.0) is None
    for i, ttl in enumerate((30.0, 10.0, 20.0, 40.0)):
        cache.put(f"k{i}", i, now=0.0, ttl_s=ttl)
    assert len(cache) == 3
    assert cache.get("k1", 1.0) is None  # the one expiring soonest made room
    assert cache.get("k3", 1.0) == 3


def test_dns_server_addresses() -> None:
    assert dns_server_address("192.0.2.53") == ("192.0.2.53", 53)
    assert dns_server_address("127.0.0.1:5353") == ("127.0.0.1", 5353)
    assert dns_server_address("::1") == ("::1", 53)
    assert dns_server_address("[::1]:5353") == ("::1", 5353)
    for bad in ("ns.example.com", "127.0.0.1:0", "127.0.0.1:x", "[::1]5353", "1.2.3.4:70000"):
        with pytest.raises(ValueError):
            dns_server_address(bad)
