"""The seam the legs get (``bridge.io.services``): the generation a new call starts under,
and a standalone ``Services`` for tests and benchmarks."""

from __future__ import annotations

import asyncio
import os
from dataclasses import replace

from bridge.config import parse_config
from bridge.io.services import Runtime, Services
from bridge.io.ticker import MediaTicker
from bridge.providers.prompts import PromptCache

TIMEOUT_S = 10 * float(os.environ.get("CALLBRIDGE_TEST_TIME_FACTOR", "1"))
CONFIG = """
[providers.p]
protocol = "kova"
url = "ws://127.0.0.1:9/v1/ws/kova"
[[routes]]
match = "*"
provider = "p"
"""


def test_a_new_call_is_routed_by_its_generation_once_there_is_one() -> None:
    async def main() -> None:
        first = parse_config(CONFIG, "first.toml")
        ticker = MediaTicker(asyncio.get_running_loop())
        try:
            services = Services.standalone(first, ticker)
            assert services.call_config() is first  # no generation built yet
            second = replace(first, path="second.toml")
            services.runtime = Runtime(second, pools={}, cache=PromptCache(0))
            assert services.call_config() is second
        finally:
            ticker.close()

    asyncio.run(main())


def test_standalone_services_run_what_they_spawn() -> None:
    async def main() -> list[str]:
        ticker = MediaTicker(asyncio.get_running_loop())
        try:
            services = Services.standalone(parse_config(CONFIG, "t.toml"), ticker)
            ran: list[str] = []
            done = asyncio.Event()

            async def job() -> None:
                ran.append("job")
                done.set()

            services.spawn(job())
            await asyncio.wait_for(done.wait(), TIMEOUT_S)
            services.generation_idle()  # standalone: nothing to retire, and no error
            return ran
        finally:
            ticker.close()

    assert asyncio.run(main()) == ["job"]
