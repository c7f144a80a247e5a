"""Connection caps of one TCP listener: global and per source, checked at accept.

Pure bookkeeping (no socket, no clock): the listener asks ``admit(source)``
when a connection is accepted, closes it at once on a refusal, and calls
``release(source)`` when an admitted connection ends. ``bridge.config
.ConnectionLimits`` carries the caps (``max_connections``,
``max_connections_per_source`` of the listener's section).
"""

from __future__ import annotations

from bridge.config import ConnectionLimits

__all__ = ["ConnectionGate"]


class ConnectionGate:
    """Counts one listener's open connections, in all and by source address."""

    __slots__ = ("_by_source", "limits", "open", "refused_per_source", "refused_total")

    def __init__(self, limits: ConnectionLimits) -> None:
        self.limits = limits
        self.open = 0
        self._by_source: dict[str, int] = {}
        self.refused_total = 0
        """Connections refused because the listener was at ``max_connections``."""
        self.refused_per_source = 0
        """Connections refused because their source was at ``max_connections_per_source``."""

    def admit(self, source: str) -> str | None:
        """Count a new connection from ``source``; or the cap it would exceed
        (``"max_connections"`` / ``"max_connections_per_source"``), counting nothing."""
        if self.open >= self.limits.max_connections:
            self.refused_total += 1
            return "max_connections"
        held = self._by_source.get(source, 0)
        if held >= self.limits.max_connections_per_source:
            self.refused_per_source += 1
            return "max_connections_per_source"
        self._by_source[source] = held + 1
        self.open += 1
        return None

    def release(self, source: str) -> None:
        """An admitted connection from ``source`` ended."""
        held = self._by_source.get(source, 0)
        if held <= 0:
            return
        self.open -= 1
        if held == 1:
            del self._by_source[source]
        else:
            self._by_source[source] = held - 1

    def from_source(self, source: str) -> int:
        """Open connections from ``source``."""
        return self._by_source.get(source, 0)
