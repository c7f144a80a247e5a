"""Whose underrun (``bridge.providers.underrun``): the verdict from what waited unread, and
a watched verdict settled by the byte offsets handed over later."""

from __future__ import annotations

import pytest

from bridge.media.underrun import DryWatches, dry_verdict


@pytest.mark.parametrize(
    ("kernel", "unconsumed", "encrypted", "window", "verdict"),
    [
        (0, 0, False, 1000, "provider"),  # nothing waited: the provider had not sent it
        (0, 0, True, None, "provider"),
        (10, 0, False, 1000, "watch"),
        (0, 10, False, 1000, "watch"),
        (10, 0, True, 1000, "daemon"),  # TLS: the kernel counts encrypted bytes
        (1000, 0, False, 1000, "daemon"),  # the window may have held the provider back
        (10, 0, False, None, "daemon"),  # the window is unknown
    ],
)
def test_the_verdict_from_what_waited_unread(
    kernel: int, unconsumed: int, encrypted: bool, window: int | None, verdict: str
) -> None:
    assert dry_verdict(kernel, unconsumed, encrypted, window) == verdict


def test_a_watch_settles_to_the_provider_once_its_bytes_held_other_audio() -> None:
    settled: list[str] = []
    watches = DryWatches()
    watches.add("a", 500, lambda: settled.append("a"))
    watches.add("b", 800, lambda: settled.append("b"))
    watches.settle(499)
    assert settled == [] and watches
    watches.settle(500)  # everything that waited for a is handed over, none of it a's
    assert settled == ["a"]
    watches.audio("b")  # b's audio was among the bytes: stays the daemon's
    watches.settle(10_000)
    assert settled == ["a"] and not watches
