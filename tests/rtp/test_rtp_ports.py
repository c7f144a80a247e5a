"""RTP port allocator: even ports, exhaustion, release, unusable ports, randomness."""

from __future__ import annotations

import random

import pytest

from bridge.rtp.ports import RtpPortAllocator


def test_even_ports_with_their_rtcp_partner_inside_the_range() -> None:
    allocator = RtpPortAllocator((20000, 20009), random.Random(1))
    ports = [allocator.allocate(f"call-{i}") for i in range(5)]
    assert sorted(p for p in ports if p is not None) == [20000, 20002, 20004, 20006, 20008]
    # An odd low bound starts at the next even port; a lone even top port is left out.
    odd = RtpPortAllocator((20001, 20006), random.Random(1))
    got = {odd.allocate(i) for i in range(3)}
    assert got == {20002, 20004, None}


def test_exhaustion_returns_none_and_release_frees() -> None:
    allocator = RtpPortAllocator((30000, 30005), random.Random(2))
    a, b, c = (allocator.allocate(name) for name in "abc")
    assert None not in (a, b, c) and len({a, b, c}) == 3
    assert allocator.allocate("d") is None
    assert (allocator.free_count, allocator.allocated_count) == (0, 3)
    allocator.release("b")
    allocator.release("b")  # idempotent
    allocator.release("never-allocated")
    assert allocator.allocate("d") == b
    assert allocator.port_of("d") == b and allocator.port_of("b") is None


def test_same_call_gets_the_same_port() -> None:
    allocator = RtpPortAllocator((30000, 30099), random.Random(3))
    assert allocator.allocate("x") == allocator.allocate("x")
    assert allocator.allocated_count == 1


def test_never_double_allocates_under_churn() -> None:
    rng = random.Random(4)
    allocator = RtpPortAllocator((40000, 40199), random.Random(5))
    held: dict[int, int] = {}
    for step in range(5000):
        if held and rng.random() < 0.45:
            call = rng.choice(list(held))
            allocator.release(call)
            del held[call]
        else:
            port = allocator.allocate(step)
            if port is None:
                assert len(held) == 100
                continue
            assert port not in held.values()
            held[step] = port
        assert allocator.allocated_count == len(held)
        assert allocator.free_count == 100 - len(held)


def test_released_port_is_not_reused_while_others_are_free() -> None:
    allocator = RtpPortAllocator((50000, 50199), random.Random(6))
    first = allocator.allocate("a")
    allocator.release("a")
    later = [allocator.allocate(i) for i in range(80)]
    assert first not in later


def test_mark_unusable() -> None:
    allocator = RtpPortAllocator((20000, 20005), random.Random(7))
    port = allocator.allocate("a", 0.0)
    assert port is not None
    allocator.mark_unusable(port, 0.0)  # bind failed: the call loses it
    assert allocator.port_of("a") is None
    replacement = allocator.allocate("a", 1.0)
    assert replacement not in (None, port)
    allocator.release("a")
    others = {allocator.allocate(i, 2.0) for i in range(3)}
    assert port not in others and None in others  # only 2 usable ports remain
    free_port = RtpPortAllocator((20000, 20003), random.Random(7))
    free_port.mark_unusable(20002, 0.0)
    assert {free_port.allocate(1, 1.0), free_port.allocate(2, 1.0)} == {20000, None}


def test_an_unusable_port_is_tried_again_after_its_cool_down() -> None:
    allocator = RtpPortAllocator((20000, 20003), random.Random(8))  # ports 20000 and 20002
    for port in (20000, 20002):
        allocator.mark_unusable(port, 100.0, cooldown_s=60.0)
    assert allocator.usable_count(100.0) == 0 and allocator.unusable_count == 2
    assert allocator.allocate("a", 159.9) is None  # still cooling down
    assert allocator.usable_count(160.0) == 2 and allocator.unusable_count == 0
    assert allocator.allocate("a", 160.0) in (20000, 20002)
    assert allocator.allocate("b", 160.0) in (20000, 20002)
    assert allocator.allocate("c", 160.0) is None  # both held: exhausted, not unusable


def test_marking_again_pushes_the_retry_out_and_a_held_port_is_not_duplicated() -> None:
    allocator = RtpPortAllocator((20000, 20001), random.Random(9))  # one port: 20000
    assert allocator.allocate("a", 0.0) == 20000
    allocator.mark_unusable(20000, 0.0, cooldown_s=10.0)  # the call loses it
    allocator.mark_unusable(20000, 5.0, cooldown_s=10.0)  # failed again: retry at 15
    assert allocator.allocate("a", 12.0) is None  # the first mark's time is stale
    assert allocator.allocate("a", 15.0) == 20000
    allocator.release("a")
    allocator.release("a")
    assert allocator.usable_count(100.0) == 1  # back once, never twice in the queue
    assert allocator.allocate("b", 100.0) == 20000 and allocator.allocate("c", 100.0) is None


def test_a_marked_port_held_by_no_call_comes_back_after_release_and_cool_down() -> None:
    allocator = RtpPortAllocator((20000, 20003), random.Random(10))
    port = allocator.allocate("a", 0.0)
    assert port is not None
    allocator.mark_unusable(port, 0.0, cooldown_s=1.0)
    allocator.release("a")  # the call ends: nothing to give back, the mark stands
    assert allocator.usable_count(0.5) == 1
    assert allocator.usable_count(1.0) == 2


def test_start_is_randomised() -> None:
    firsts = {
        RtpPortAllocator((20000, 20999), random.Random(seed)).allocate("c") for seed in range(20)
    }
    assert len(firsts) > 10


def test_empty_range_rejected() -> None:
    with pytest.raises(ValueError, match="no even/odd port pair"):
        RtpPortAllocator((20000, 20000))
    with pytest.raises(ValueError, match="no even/odd port pair"):
        RtpPortAllocator((65534, 65536))
