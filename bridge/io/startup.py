"""Start-up failures a user can cause, and the exit status of each (docs/operations.md).

``callbridge serve`` ends with one line naming the key, the address and the cause
(``sip.listen: 127.0.0.1:5060 (udp): address already in use``) and a status systemd can
tell apart (``RestartPreventExitStatus=`` in the units), never a traceback.
"""

from __future__ import annotations

import errno
import os

__all__ = [
    "EXIT_CONFIG",
    "EXIT_EMBEDDED",
    "EXIT_LISTEN",
    "StartupError",
    "listen_error",
]

EXIT_CONFIG = 2
"""The config is invalid or cannot be read (a secret file included): every error names its key."""
EXIT_LISTEN = 3
"""A listener could not bind its address (taken, not this host's, a port < 1024 without
the capability)."""
EXIT_EMBEDDED = 4
"""The embedded TTS server (``url = "embedded"``) did not start."""

_HINTS = {
    errno.EACCES: "ports below 1024 need CAP_NET_BIND_SERVICE (docs/deployment.md)",
    errno.EADDRNOTAVAIL: "not an address of this host",
}


class StartupError(Exception):
    """The daemon cannot start; ``str()`` is the one line to print, ``exit_status`` the
    process's exit status."""

    def __init__(self, message: str, exit_status: int) -> None:
        super().__init__(message)
        self.exit_status = exit_status


def listen_error(key: str, address: str, transport: str, error: OSError) -> StartupError:
    """``key: address (transport): cause`` for a listener that could not bind."""
    # asyncio rewrites a bind error's text ("error while attempting to bind on ..."): the
    # errno's own text says it once; a resolver error (negative errno) keeps its own
    code = error.errno
    cause = os.strerror(code) if code and code > 0 else (error.strerror or str(error)).strip()
    cause = cause[:1].lower() + cause[1:]
    hint = _HINTS.get(code or 0)
    if hint:
        cause = f"{cause} ({hint})"
    return StartupError(f"{key}: {address} ({transport}): {cause}", EXIT_LISTEN)
