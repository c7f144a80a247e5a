"""The process-wide ticker: paces every stream from one timer, and knows when it runs late."""

from __future__ import annotations

import asyncio
import time

from bridge.io.ticker import MediaTicker


def test_frames_are_ticked_in_order_and_a_stalled_loop_reads_as_overloaded() -> None:
    async def main() -> None:
        ticker = MediaTicker(asyncio.get_running_loop())
        frames: dict[str, list[int]] = {"a": [], "b": []}
        for key in frames:
            ticker.add(key, lambda n, now, k=key: frames[k].append(n), lambda e: None)
        await asyncio.sleep(0.3)
        assert frames["a"][:5] == [0, 1, 2, 3, 4] and len(frames["b"]) >= 10
        assert not ticker.overloaded(0.008)
        for _ in range(30):  # a saturated core: every wake-up 25 ms late
            time.sleep(0.025)
            await asyncio.sleep(0)
        assert ticker.lag_s > 0.008 and ticker.overloaded(0.008)
        assert not ticker.overloaded(0.0)  # 0 switches the check off
        ticker.remove("a")
        ticker.remove("b")
        assert not ticker.overloaded(0.008)  # no calls: nothing to protect
        ticker.close()

    asyncio.run(main())
