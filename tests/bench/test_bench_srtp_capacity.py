"""bench/bench_srtp_capacity.py's run order, and the load generator's SRTP precondition."""

from __future__ import annotations

import pytest

from bench.bench_srtp_capacity import order
from bench.loadgen.rtp import RtpLoad


def test_modes_alternate_rep_by_rep_so_a_drift_weighs_on_both() -> None:
    modes = ["plain", "srtp"]
    assert [order(modes, r) for r in range(4)] == [
        ["plain", "srtp"],
        ["srtp", "plain"],
        ["plain", "srtp"],
        ["srtp", "plain"],
    ]


def test_srtp_without_tls_is_refused_before_anything_is_sent() -> None:
    # the daemon takes SDES keys over TLS only (docs/sip.md): a UDP run could not key a call
    with pytest.raises(ValueError, match="TLS"):
        RtpLoad(("127.0.0.1", 9), srtp=True)
