"""The trunk choice and each trunk's limits (``bridge.sip.trunks``), time passed in."""

from __future__ import annotations

import pytest

from bridge.sip.settings import TrunkConfig
from bridge.sip.trunks import TrunkError, TrunkLimiter, choose_trunk, inbound_trunk


def trunk(name: str, *sources: str) -> TrunkConfig:
    return TrunkConfig(name, f"sip:{name}.example.com", sources=sources)


A, B = trunk("a", "192.0.2.0/24"), trunk("b", "198.51.100.7/32", "2001:db8::/32")


def test_the_named_trunk_is_chosen_for_any_target() -> None:
    assert choose_trunk((A, B), "b", "sip:bob@example.org") is B
    assert choose_trunk((A, B), "a", "tel:+15551230000") is A


def test_an_unknown_name_is_an_error_listing_the_trunks() -> None:
    with pytest.raises(TrunkError, match=r"no trunk 'c' \(trunks: a, b\)"):
        choose_trunk((A, B), "c", "tel:+15551230000")
    with pytest.raises(TrunkError, match=r"no trunk 'c' \(trunks: none configured\)"):
        choose_trunk((), "c", "sip:bob@example.org")


def test_tel_targets_take_the_only_trunk_else_need_a_name() -> None:
    assert choose_trunk((A,), "", "tel:+15551230000") is A
    assert choose_trunk((A,), "", "<TEL:+15551230000>") is A
    with pytest.raises(TrunkError, match="a tel: target needs a trunk: name one in 'trunk'"):
        choose_trunk((A, B), "", "tel:+15551230000")
    assert choose_trunk((), "", "tel:+15551230000") is None  # [sip] outbound_proxy, as before


def test_sip_targets_without_a_name_use_no_trunk() -> None:
    assert choose_trunk((A,), "", "sip:bob@a.example.com") is None


def test_inbound_trunk_by_source_address() -> None:
    assert inbound_trunk((A, B), "192.0.2.44") is A
    assert inbound_trunk((A, B), "198.51.100.7") is B
    assert inbound_trunk((A, B), "198.51.100.8") is None
    assert inbound_trunk((A, B), "2001:db8::1") is B
    assert inbound_trunk((A, B), "[2001:db8::1]") is B
    assert inbound_trunk((A, B), "::ffff:192.0.2.44") is A  # a dual-stack socket's view
    assert inbound_trunk((A,), "2001:db8::1") is None  # another family: no match
    assert inbound_trunk((A, B), "not-an-address") is None
    assert inbound_trunk((trunk("none"),), "192.0.2.44") is None


def test_max_calls_refuses_one_more_until_a_call_ends() -> None:
    limiter = TrunkLimiter("a", max_calls=2, calls_per_second=0)
    for call in ("c1", "c2"):
        assert limiter.admit(0.0) is None
        limiter.started(call)
    refusal = limiter.admit(0.0)
    assert refusal is not None and refusal.reason == "max_calls"
    assert refusal.message == "trunk 'a' has max_calls = 2 calls up"
    assert limiter.admit(0.0, outbound=False) is not None  # inbound calls count too
    limiter.ended("c1")
    limiter.ended("c1")  # twice: no effect
    assert limiter.active == 1
    assert limiter.admit(0.0) is None


def test_calls_per_second_refuses_past_the_bucket_and_says_how_long_to_wait() -> None:
    limiter = TrunkLimiter("a", max_calls=0, calls_per_second=2)
    assert [limiter.admit(10.0) is None for _ in range(3)] == [True, True, False]
    refusal = limiter.admit(10.0)
    assert refusal is not None and refusal.reason == "calls_per_second"
    assert refusal.retry_after_s == pytest.approx(0.5)
    assert "calls_per_second = 2; try again in 0.5 s" in refusal.message
    assert limiter.admit(10.25) is not None  # half a token
    assert limiter.admit(10.5) is None  # one token back
    assert limiter.admit(10.5) is not None
    assert limiter.admit(12.0) is None and limiter.admit(12.0) is None  # full again: 2
    assert limiter.admit(12.0) is not None


def test_a_fractional_rate_paces_one_call_at_a_time() -> None:
    limiter = TrunkLimiter("a", max_calls=0, calls_per_second=0.5)
    assert limiter.admit(0.0) is None
    refusal = limiter.admit(1.0)
    assert refusal is not None and refusal.retry_after_s == pytest.approx(1.0)
    assert limiter.admit(2.0) is None


def test_the_rate_applies_to_calls_out_only_and_a_refusal_takes_no_place() -> None:
    limiter = TrunkLimiter("a", max_calls=1, calls_per_second=1)
    assert limiter.admit(0.0, outbound=False) is None  # inbound: no token taken
    assert limiter.admit(0.0) is None  # the token is still there
    assert limiter.active == 0  # admit() alone holds no place: started() does
