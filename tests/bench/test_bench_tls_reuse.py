"""bench/bench_tls_reuse.py end to end, tiny: every INVITE placed through the TLS trunk
reaches the peer, each is ACKed after its 486, and all of them share one TLS handshake
(issue 34: one handshake per trunk peer). Counts only, never a time."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_twenty_invites_through_a_tls_trunk_share_one_handshake(tmp_path: Path) -> None:
    out = tmp_path / "tls_reuse.json"
    subprocess.run(
        [sys.executable, "-m", "bench.bench_tls_reuse", "--quick", "--invites", "20",
         "--rate", "50", "--out", str(out)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(
            [str(ROOT), str(ROOT / "codecs"), os.environ.get("PYTHONPATH", "")])},
        check=True,
        capture_output=True,
    )  # fmt: skip
    figures = json.loads(out.read_text())["figures"]
    assert figures["api_statuses"] == {"201": 20}
    assert figures["invites_received"] == 20
    assert figures["distinct_numbers_invited"] == 20
    assert figures["acks_received"] == 20
    assert figures["tls_handshakes"] == 1
    assert figures["calls_active_after"] == 0
