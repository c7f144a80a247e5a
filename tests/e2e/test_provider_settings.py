"""A provider's connection settings in the config reach its pool in the running daemon."""

from __future__ import annotations

import asyncio

from bridge.config import parse_config
from bridge.io.daemon import Daemon
from bridge.io.ttsd_server import start_tts_server

from .harness import FACTOR, config_text

ROUTE = """
[[routes]]
match = "*"
provider = "main"
"""


def test_turns_per_connection_flow_control_and_idle_closing_reach_the_pool() -> None:
    async def body() -> None:
        tts = await start_tts_server(engine="tone")
        try:
            plain = config_text(tts.port, ROUTE)
            tuned = plain.replace(
                'api_key = "k"',
                'api_key = "k"\nturns_per_connection = 8\nflow_control_ahead_s = 3\n'
                "close_idle_after_s = 0",
            )
            for text, expected in ((plain, (None, None, 60.0)), (tuned, (8, 3.0, None))):
                daemon = Daemon(parse_config(text, "test.toml"))
                await daemon.start()
                try:
                    pool = daemon.runtime.pools["main"]
                    got = (pool.turns_per_connection, pool.flow_high_s, pool.close_idle_after_s)
                    assert got == expected
                    if expected[1] is not None:
                        assert pool.flow_low_s == 1.5  # reads again at half the mark
                finally:
                    await daemon.drain_and_stop()
                    await daemon.close()
        finally:
            await tts.close()

    asyncio.run(asyncio.wait_for(body(), 30 * FACTOR))
