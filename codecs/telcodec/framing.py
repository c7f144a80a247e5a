"""Cut a byte stream into exact, fixed-size frames.

Theory of operation
-------------------
Provider audio arrives in chunks of any size; every frame on a telephony wire
is exactly 20 ms (160 samples at 8 kHz: 320 bytes of s16le, 160 bytes of
G.711). A ``FrameCutter`` holds the bytes that do not yet make a whole frame
and emits every whole frame as soon as it is complete, in order, so the
concatenation of all emitted frames plus ``pending_bytes`` always equals the
concatenation of everything pushed (minus what ``clear()`` dropped).

* ``push(data)`` appends and returns the frames completed by it (often none,
  sometimes many).
* ``flush(pad)`` ends the stream: the last partial frame, if any, is returned
  filled up with the repeated ``pad`` pattern (the silence of the encoding:
  ``b"\\xff"`` for mu-law, ``b"\\xd5"`` for A-law, ``b"\\x00"`` for s16le).
* ``clear()`` drops the partial frame (barge-in).

The cutter knows nothing of encodings; sample alignment is the caller's
business (for s16le use an even ``frame_bytes``).
"""

from __future__ import annotations

__all__ = ["FrameCutter"]


class FrameCutter:
    """Turn arbitrary chunks into frames of exactly ``frame_bytes`` bytes.

    Args:
        frame_bytes: size of every emitted frame; the default 320 is 20 ms of
            s16le at 8 kHz (use 160 for G.711).

    Raises:
        ValueError: ``frame_bytes`` is not positive.
    """

    __slots__ = ("_buffer", "_frame_bytes")

    def __init__(self, frame_bytes: int = 320) -> None:
        if frame_bytes <= 0:
            raise ValueError(f"frame_bytes must be positive, got {frame_bytes}")
        self._frame_bytes = frame_bytes
        self._buffer = bytearray()

    @property
    def frame_bytes(self) -> int:
        """Size of every frame this cutter emits."""
        return self._frame_bytes

    @property
    def pending_bytes(self) -> int:
        """Bytes held back because they do not yet make a whole frame."""
        return len(self._buffer)

    @property
    def missing_bytes(self) -> int:
        """Bytes that would complete the partial frame (a whole frame when none is begun)."""
        return self._frame_bytes - len(self._buffer)

    def push(self, data: bytes | bytearray | memoryview) -> list[bytes]:
        """Append ``data`` and return every frame it completes, oldest first."""
        size = self._frame_bytes
        buffer = self._buffer
        if type(data) is not bytes:
            buffer += data
            whole = len(buffer) - len(buffer) % size
            frames = [bytes(buffer[i : i + size]) for i in range(0, whole, size)]
            del buffer[:whole]
            return frames
        # Bytes: the frames are sliced from the caller's chunk (one copy each), after
        # the partial frame held, if any, is completed from its head.
        n = len(data)
        start = 0
        frames = []
        if buffer:
            start = size - len(buffer)
            if n < start:
                buffer += data
                return frames
            buffer += data[:start]
            frames.append(bytes(buffer))
            buffer.clear()
        end = n - (n - start) % size
        frames += [data[i : i + size] for i in range(start, end, size)]
        if end < n:
            buffer += data[end:]
        return frames

    def flush(self, pad: bytes) -> bytes | None:
        """Return the partial frame padded to full size, or None if none is pending.

        Args:
            pad: the fill pattern, repeated (and truncated) as needed.

        Raises:
            ValueError: ``pad`` is empty.
        """
        if not pad:
            raise ValueError("pad must not be empty")
        if not self._buffer:
            return None
        missing = self._frame_bytes - len(self._buffer)
        repeats = -(-missing // len(pad))
        frame = bytes(self._buffer) + (pad * repeats)[:missing]
        self._buffer.clear()
        return frame

    def clear(self) -> None:
        """Drop the pending partial frame."""
        self._buffer.clear()
