"""Which module is which provider protocol: the one way code outside
``bridge/providers/`` reaches a protocol's engines (the daemon's provider pools,
the config reader, ``callbridge tts-server``).

Each protocol is a package ``bridge/providers/<protocol>/`` with ``wire.py``
(its message names, fields, error codes and their encoding, written once),
``client.py`` (the client engine: ``ENGINE``, ``OPTIONS``) and ``server.py``
(the ``tts-server`` session: ``SESSION``, ``PATHS``). Modules are imported on
first use, so a process loads only the protocols it uses.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from bridge.providers.base import OptionType, TtsProtocol

__all__ = ["PROTOCOLS", "client_module", "engine_class", "protocol_options", "server_module"]

PROTOCOLS: tuple[str, ...] = ("kova", "kugelaudio", "kletso", "coda", "zwst")


def _module(protocol: str, side: str) -> ModuleType:
    if protocol not in PROTOCOLS:
        raise ValueError(f"unknown provider protocol {protocol!r}")
    return importlib.import_module(f"bridge.providers.{protocol}.{side}")


def client_module(protocol: str) -> ModuleType:
    """The client engine module of ``protocol`` (``ENGINE``, ``OPTIONS``, pooling hooks)."""
    return _module(protocol, "client")


def server_module(protocol: str) -> ModuleType:
    """The ``tts-server`` session module of ``protocol`` (``SESSION``, ``PATHS``)."""
    return _module(protocol, "server")


def engine_class(protocol: str) -> type[TtsProtocol]:
    """The client engine class of ``protocol``."""
    cls: type[TtsProtocol] = client_module(protocol).ENGINE
    return cls


def protocol_options(protocol: str) -> dict[str, OptionType]:
    """The ``[providers.NAME]`` options ``protocol`` declares, and their types."""
    options: dict[str, OptionType] = client_module(protocol).OPTIONS
    return options
