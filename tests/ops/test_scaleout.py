"""Scale-out behind Kamailio (config/kamailio/kamailio.cfg, unchanged).

Kamailio's dispatcher spreads SIPp calls over two nodes, probes them with
OPTIONS, stops sending new calls to a node that drains (OPTIONS 503) while
its calls in progress finish through the Record-Route path, and fails over
to the other node on an INVITE 503 or on silence.

Two kinds of node:
  * real callbridge daemons (``tests/ops/conftest.py``): the end-to-end test;
    it skips, with the reason "SIP leg not wired into the daemon", only
    while a daemon's SIP port answers no OPTIONS;
  * ``SipNode``, a minimal SIP agent with the daemon's drain behaviour: it
    tests the Kamailio configuration itself, whatever the daemon's state.
"""

from __future__ import annotations

import re
import signal
import socket
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from .conftest import FACTOR, daemon_config, listeners
from .scaleout import (
    Kamailio,
    SipNode,
    http_get,
    metric_sum,
    sip_options,
    sipp,
    sipp_wait,
    start_kamailio,
    stop_process,
    wait_until,
)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.peers,
    pytest.mark.needs("kamailio", "sipp"),
]

StartKamailio = Callable[..., Kamailio]


@pytest.fixture
def kamailio(tmp_path: Path) -> Iterator[StartKamailio]:
    started: list[Kamailio] = []

    def start(node_ports: list[int], **kw: int) -> Kamailio:
        k = start_kamailio(tmp_path, node_ports, **kw)
        started.append(k)
        return k

    yield start
    for k in started:
        stop_process(k.proc)


@pytest.fixture
def nodes() -> Iterator[list[SipNode]]:
    pair = [SipNode(), SipNode()]
    yield pair
    for n in pair:
        n.close()


def test_config_checks() -> None:
    from .scaleout import KAMAILIO_CFG

    out = subprocess.run(
        ["kamailio", "-c", "-f", str(KAMAILIO_CFG)], capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "config file ok" in out.stdout + out.stderr


def test_calls_spread_and_a_draining_node_gets_no_new_calls(
    tmp_path: Path, kamailio: StartKamailio, nodes: list[SipNode]
) -> None:
    a, b = nodes
    k = kamailio([a.port, b.port])
    assert k.wait_flags(a.port, "A", 10) and k.wait_flags(b.port, "A", 10), k.dispatcher_flags()

    # 1. short calls go round robin over both nodes
    code, out = sipp_wait(sipp(tmp_path, k.port, calls=10, rate_cps=20, duration_ms=100, tag="rr"))
    assert code == 0, out
    assert len(a.invites) + len(b.invites) == 10
    assert len(a.invites) == len(b.invites) == 5, (a.invites, b.invites)
    assert len(a.byes) == 5 and len(b.byes) == 5

    # 2. long calls on both nodes, then node a starts draining
    long_calls = sipp(tmp_path, k.port, calls=4, rate_cps=20, duration_ms=5000, tag="long")
    assert wait_until(lambda: a.active == 2 and b.active == 2, 10), (a.active, b.active)
    a.draining = True
    assert k.wait_flags(a.port, "I", 5), k.dispatcher_flags()
    assert k.dispatcher_flags()[b.port].startswith("A")
    a_before, b_before = len(a.invites), len(b.invites)

    # 3. new calls all go to node b; node a's calls in progress continue
    code, out = sipp_wait(sipp(tmp_path, k.port, calls=6, rate_cps=20, duration_ms=100, tag="new"))
    assert code == 0, out
    assert len(a.invites) == a_before and a.refused == []
    assert len(b.invites) == b_before + 6
    assert a.active == 2, "node a's calls must still be up"

    code, out = sipp_wait(long_calls)
    assert code == 0, out
    assert a.active == 0 and b.active == 0
    assert set(a.byes) == set(a.invites), "every call on the draining node ended with its BYE"

    # 4. node a is back: it is probed active again and gets calls again
    a.draining = False
    assert k.wait_flags(a.port, "A", 5), k.dispatcher_flags()
    code, out = sipp_wait(sipp(tmp_path, k.port, calls=4, rate_cps=20, duration_ms=100, tag="back"))
    assert code == 0, out
    assert len(a.invites) > a_before


def test_invite_503_fails_over_to_the_next_node(
    tmp_path: Path, kamailio: StartKamailio, nodes: list[SipNode]
) -> None:
    """A node that starts draining between two probes answers the INVITE 503:
    the call goes to the other node and the first is marked inactive."""
    a, b = nodes
    k = kamailio([a.port, b.port], ping_interval_s=60)
    assert k.wait_flags(a.port, "A", 10) and k.wait_flags(b.port, "A", 10)
    a.draining = True  # Kamailio cannot know yet: the next probe is a minute away
    code, out = sipp_wait(sipp(tmp_path, k.port, calls=4, rate_cps=20, duration_ms=100, tag="503"))
    assert code == 0, out
    assert len(a.refused) == 1, "one INVITE reached node a, was refused and failed over"
    assert a.invites == []
    assert len(b.invites) == 4
    assert k.dispatcher_flags()[a.port].startswith("I")


def test_silent_node_fails_over_after_fr_timer(
    tmp_path: Path, kamailio: StartKamailio, nodes: list[SipNode]
) -> None:
    a, b = nodes
    k = kamailio([a.port, b.port], ping_interval_s=60, fr_timer_ms=1000)
    assert k.wait_flags(a.port, "A", 10) and k.wait_flags(b.port, "A", 10)
    a.silence()
    code, out = sipp_wait(sipp(tmp_path, k.port, calls=4, rate_cps=20, duration_ms=100, tag="t"))
    assert code == 0, out
    assert len(b.invites) == 4
    assert k.dispatcher_flags()[a.port].startswith("I")


def test_no_active_node_gets_503_with_retry_after(
    tmp_path: Path, kamailio: StartKamailio, nodes: list[SipNode]
) -> None:
    a, b = nodes
    a.draining = b.draining = True
    k = kamailio([a.port, b.port])
    assert k.wait_flags(a.port, "I", 5) and k.wait_flags(b.port, "I", 5), k.dispatcher_flags()
    code, out = sipp_wait(sipp(tmp_path, k.port, calls=1, rate_cps=5, duration_ms=100, tag="x"))
    assert code != 0, out
    errors = "".join(p.read_text() for p in tmp_path.glob("sipp-x-errors.log"))
    assert "503 No callbridge node available" in errors and "Retry-After: 10" in errors
    assert a.invites == b.invites == []


def test_second_failover_logs_each_failed_node(tmp_path: Path, kamailio: StartKamailio) -> None:
    """A call refused (503) by two nodes before the third takes it: the log names
    each node that failed, in order, and exactly those are marked inactive."""
    trio = [SipNode(), SipNode(), SipNode()]
    try:
        k = kamailio([n.port for n in trio], ping_interval_s=60)
        assert all(k.wait_flags(n.port, "A", 10) for n in trio), k.dispatcher_flags()
        order = []  # the round robin's order: one call at a time
        for i in range(3):
            before = [len(n.invites) for n in trio]
            code, out = sipp_wait(
                sipp(tmp_path, k.port, calls=1, rate_cps=5, duration_ms=50, tag=f"o{i}")
            )
            assert code == 0, out
            order += [n for n, was in zip(trio, before, strict=True) if len(n.invites) > was]
        assert len(order) == 3 and len({n.port for n in order}) == 3
        first, second, third = order
        # the next call goes to `first`, fails over to `second`, then to `third`;
        # Kamailio cannot know the two refuse: the next probe is a minute away
        first.draining = second.draining = True
        code, out = sipp_wait(sipp(tmp_path, k.port, calls=1, rate_cps=5, duration_ms=50, tag="f"))
        assert code == 0, out
        assert len(first.refused) == len(second.refused) == 1 and len(third.invites) == 2
        log = k.log.read_text()
        failed = re.findall(r"node sip:127\.0\.0\.1:(\d+) failed \(503\)", log)
        assert [int(p) for p in failed] == [first.port, second.port], log[-2000:]
        moved = re.findall(r"failover to sip:127\.0\.0\.1:(\d+)", log)
        assert [int(p) for p in moved] == [second.port, third.port], log[-2000:]
        flags = k.dispatcher_flags()
        assert [flags[n.port][0] for n in order] == ["I", "I", "A"], flags
    finally:
        for n in trio:
            n.close()


def test_rate_limited_answer_goes_back_and_the_node_stays_active(
    tmp_path: Path, kamailio: StartKamailio, nodes: list[SipNode]
) -> None:
    """A node's "503 Rate Limited" is a live node speaking about one caller: the
    caller gets it with its Retry-After, no other node gets the call, and the
    node stays active."""
    a, b = nodes
    k = kamailio([a.port, b.port], ping_interval_s=60)
    assert k.wait_flags(a.port, "A", 10) and k.wait_flags(b.port, "A", 10)
    a.rate_limited = True
    code, out = sipp_wait(sipp(tmp_path, k.port, calls=4, rate_cps=20, duration_ms=100, tag="rl"))
    assert code != 0, out  # the calls round robin sent to node a failed
    assert len(a.refused) == 2 and a.invites == [], (a.refused, a.invites)
    assert len(b.invites) == 2, "no refused call moved to node b"
    errors = (tmp_path / "sipp-rl-errors.log").read_text()
    assert "Rate Limited" in errors and "Retry-After: 3" in errors, errors[-2000:]
    assert k.dispatcher_flags()[a.port].startswith("A"), k.dispatcher_flags()
    assert "marking it inactive" not in k.log.read_text()


def test_the_proxy_reports_the_caller_and_drops_a_forged_report(
    kamailio: StartKamailio, nodes: list[SipNode]
) -> None:
    a, b = nodes
    k = kamailio([a.port, b.port])
    assert k.wait_flags(a.port, "A", 10) and k.wait_flags(b.port, "A", 10)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.7", 0))
        port = s.getsockname()[1]
        s.sendto(
            (
                f"INVITE sip:demo@127.0.0.1:{k.port} SIP/2.0\r\n"
                f"Via: SIP/2.0/UDP 127.0.0.7:{port};branch=z9hG4bKforged1;rport\r\n"
                f"From: <sip:c@127.0.0.7>;tag=f1\r\nTo: <sip:demo@127.0.0.1>\r\n"
                "Call-ID: forged-1\r\nCSeq: 1 INVITE\r\n"
                f"Contact: <sip:c@127.0.0.7:{port}>\r\nMax-Forwards: 70\r\n"
                "X-Callbridge-Source: 198.51.100.99\r\nContent-Length: 0\r\n\r\n"
            ).encode(),
            ("127.0.0.1", k.port),
        )
        assert wait_until(lambda: len(a.sources) + len(b.sources) == 1, 5)
    assert (a.sources + b.sources) == [["127.0.0.7"]]


# ------------------------------------------------------- the real daemons


def test_calls_spread_over_two_daemons_and_drain(
    tmp_path: Path,
    kamailio: StartKamailio,
    run_daemon: Callable[..., subprocess.Popen[bytes]],
) -> None:
    daemons = []
    for i, name in enumerate("ab"):
        d = tmp_path / name
        d.mkdir()
        lo = 32000 + 1000 * i
        cfg = daemon_config(d, drain=60, rtp_lo=lo, rtp_hi=lo + 999)
        proc = run_daemon(cfg)
        ports = listeners(proc, timeout_s=60)
        daemons.append((proc, ports.api, ports.sip))
    for _proc, api, _ in daemons:
        assert wait_until(lambda api=api: http_get(f"http://127.0.0.1:{api}/healthz")[0], 60), (
            "daemon did not start"
        )
    for _, _, sip in daemons:
        assert sip_options(sip, 2.0) is not None, "the daemon does not answer OPTIONS"

    (pa, api_a, sip_a), (pb, api_b, sip_b) = daemons

    def calls(api: int) -> float:
        return metric_sum(http_get(f"http://127.0.0.1:{api}/metrics")[1], "callbridge_calls_total")

    def active(api: int) -> float:
        text = http_get(f"http://127.0.0.1:{api}/metrics")[1]
        return metric_sum(text, "callbridge_calls_active")

    k = kamailio([sip_a, sip_b])
    assert k.wait_flags(sip_a, "A", 10) and k.wait_flags(sip_b, "A", 10), k.dispatcher_flags()

    code, out = sipp_wait(sipp(tmp_path, k.port, calls=10, rate_cps=10, duration_ms=500, tag="rr"))
    assert code == 0, out
    assert calls(api_a) > 0 and calls(api_b) > 0
    assert calls(api_a) + calls(api_b) == 10

    long_calls = sipp(tmp_path, k.port, calls=4, rate_cps=10, duration_ms=6000, tag="long")
    assert wait_until(lambda: active(api_a) >= 1 and active(api_b) >= 1, 10)
    a_total = calls(api_a)
    pa.send_signal(signal.SIGTERM)  # drain: OPTIONS 503, calls in progress continue
    assert wait_until(lambda: http_get(f"http://127.0.0.1:{api_a}/readyz")[0] == 503, 5)
    assert sip_options(sip_a) == 503
    assert k.wait_flags(sip_a, "I", 5), k.dispatcher_flags()

    b_total = calls(api_b)
    code, out = sipp_wait(sipp(tmp_path, k.port, calls=6, rate_cps=10, duration_ms=300, tag="new"))
    assert code == 0, out
    assert calls(api_b) == b_total + 6, "every new call went to the node that is not draining"
    assert calls(api_a) == a_total

    code, out = sipp_wait(long_calls)
    assert code == 0, out  # the draining node's calls completed normally
    assert pa.wait(30 * FACTOR) == 0, "the drained daemon exits 0 once its calls are over"
    assert pb.poll() is None


def test_300_calls_at_100_per_second_over_two_daemons(
    tmp_path: Path,
    kamailio: StartKamailio,
    run_daemon: Callable[..., subprocess.Popen[bytes]],
) -> None:
    """Five callers (SIPp from five loopback addresses) place 300 calls at 100
    calls/s in all through Kamailio to two daemons that trust it, with the
    default per-source INVITE limit (20/s): every call succeeds, none is
    refused, and none moves off a live node (no failover, both nodes active).

    The daemons' lag guard is off (max_loop_lag_ms = 0): on a loaded test host
    it would refuse calls for a reason that is not this test's (it has its own
    test, test_refusals.py). Where the calls landed is counted on each node's
    /metrics; a moved call would show in Kamailio's log as a failover."""
    daemons = []
    for i, name in enumerate("ab"):
        d = tmp_path / name
        d.mkdir()
        lo = 36000 + 1000 * i
        cfg = daemon_config(d, drain=5, rtp_lo=lo, rtp_hi=lo + 999)
        text = cfg.read_text().replace("[sip]\n", '[sip]\ntrusted_proxies = ["127.0.0.1"]\n')
        cfg.write_text(text.replace("[daemon]\n", "[daemon]\nmax_loop_lag_ms = 0\n"))
        proc = run_daemon(cfg, log=d / "daemon.log")
        ports = listeners(proc, timeout_s=60)
        daemons.append((proc, ports.api, ports.sip))
    for _proc, api, sip in daemons:
        assert wait_until(lambda api=api: http_get(f"http://127.0.0.1:{api}/readyz")[0] == 200, 60)
        assert sip_options(sip, 2.0) == 200
    (_, api_a, sip_a), (_, api_b, sip_b) = daemons

    def metric(api: int, name: str) -> float:
        return metric_sum(http_get(f"http://127.0.0.1:{api}/metrics")[1], name)

    # a node slow to answer on a loaded host is not a dead one: Kamailio waits
    # 10 s (x FACTOR) for a reply before failing over
    k = kamailio([sip_a, sip_b], fr_timer_ms=int(10_000 * FACTOR))
    assert k.wait_flags(sip_a, "A", 10) and k.wait_flags(sip_b, "A", 10), k.dispatcher_flags()

    callers = [
        sipp(tmp_path, k.port, calls=60, rate_cps=20, duration_ms=500, tag=f"c{i}", source=src)
        for i, src in enumerate(f"127.0.0.{n}" for n in range(11, 16))
    ]
    for i, proc in enumerate(callers):
        code, out = sipp_wait(proc, 120)
        assert code == 0, f"caller {i}: {out}"

    def landed() -> float:
        return metric(api_a, "callbridge_calls_total") + metric(api_b, "callbridge_calls_total")

    assert wait_until(lambda: landed() == 300, 30), landed()
    assert (
        metric(api_a, "callbridge_calls_total") > 0 and metric(api_b, "callbridge_calls_total") > 0
    )
    assert metric(api_a, "callbridge_rejected_total") == 0
    assert metric(api_b, "callbridge_rejected_total") == 0
    log = k.log.read_text()
    moved = [line for line in log.splitlines() if "inactive" in line or "failover" in line]
    assert moved == [], "a call moved off a live node"
    flags = k.dispatcher_flags()
    assert flags[sip_a].startswith("A") and flags[sip_b].startswith("A"), flags
