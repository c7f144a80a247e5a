"""Address ranges the SIP and RTP engines share (pure: no I/O)."""

from __future__ import annotations

import ipaddress
from typing import Final

__all__ = ["NOT_ROUTABLE"]

NOT_ROUTABLE: Final = tuple(
    ipaddress.ip_network(net)
    for net in (
        "10.0.0.0/8",  # RFC 1918
        "172.16.0.0/12",
        "192.168.0.0/16",
        "100.64.0.0/10",  # RFC 6598: carrier-grade NAT
        "127.0.0.0/8",
        "169.254.0.0/16",
        "fc00::/7",  # RFC 4193
        "fe80::/10",
        "::1/128",
    )
)
"""Addresses that cannot be reached from another network: a Contact naming one is
answered along the dialog's flow (``bridge.sip.dialog``), an SDP naming one is
latched in ``learn`` mode (``bridge.rtp.session``)."""
