"""The Twilio emulator now lives in ``bridge.streams.carrier``; this re-export keeps old imports.

``conftest.load_emulator()`` loads this file by path, so ``kit.emulator.TwilioEmulator``
is the same class the test caller (``callbridge call ws://...``) drives.
"""

from __future__ import annotations

from bridge.streams.carrier import BYTES_PER_SECOND, MAX_BUFFER_S, MarkEcho
from bridge.streams.carrier import TwilioCarrier as TwilioEmulator

__all__ = ["BYTES_PER_SECOND", "MAX_BUFFER_S", "MarkEcho", "TwilioEmulator"]
