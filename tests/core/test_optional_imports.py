"""What the daemon does not load unless its config needs it: libsrtp (pylibsrtp) and
``cryptography`` (11 MB resident together), imported in a fresh interpreter."""

from __future__ import annotations

import subprocess
import sys

CHECK = """
import sys, types
import bridge.io.daemon
from bridge.io.legs.sip import load_srtp

def loaded():
    return sorted({m.split(".")[0] for m in sys.modules} & {"pylibsrtp", "cryptography"})

print("start", loaded())
ns = types.SimpleNamespace
off = ns(sip=ns(security=ns(srtp="off")), trunks=(ns(srtp="off"),))
load_srtp(off)
print("off", loaded())
load_srtp(ns(sip=off.sip, trunks=(ns(srtp="off"), ns(srtp="require"))))
print("trunk", loaded(), "bridge.rtp.srtp" in sys.modules)
"""


def test_libsrtp_and_cryptography_load_only_where_configured() -> None:
    out = subprocess.run(
        [sys.executable, "-c", CHECK], capture_output=True, text=True, check=True, timeout=60
    ).stdout.splitlines()
    assert out == [
        "start []",
        "off []",
        "trunk ['pylibsrtp'] True",
    ]
