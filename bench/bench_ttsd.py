"""How many concurrent non-cached turns the embedded Piper voice renders in real time.

A started ``callbridge tts-server --engine piper`` (its own process, with
``--workers W``, a queue big enough that nothing is refused) gets ``N``
requests for one typical IVR sentence at once, through the daemon's own
client (``ProviderPool`` + ``Speaker``, Kova, one warm connection: what a
call's turn does), for each ``N`` of ``--concurrency``. Per request:

* ``ttfa_s``: from the turn opened to its first audio;
* ``rtf``: from the turn opened to its last audio, over the seconds of audio
  (below 1: rendered faster than it plays);
* ``gap_s``: played from its first audio on, the longest the caller would
  have waited for audio not yet there (0: no underrun).

And the server's CPU seconds (``/proc``), as seconds of audio per CPU second:
how many real-time streams one core can feed at most, a figure a busy host
disturbs less than the wall-clock ones.

A level is "real time" when every request has its first audio within
``--max-ttfa-s`` (1 s: the issue's bound on silence) and no gap over one
20 ms frame. Aggregate: seconds of audio rendered per wall second. The host
is shared: its load average and CPU count are recorded with the figures.

    python -m bench.bench_ttsd [--workers W] [--concurrency 1,2,4,6,8] [--out NAME]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench.common import write
from bridge.engine import Event
from bridge.io.embedded import KEY_ENV, PROTOCOL_PATHS
from bridge.io.provider_pool import ProviderPool, Speaker
from bridge.providers.base import (
    PCM_8K,
    AudioReceived,
    ProviderFailed,
    ProviderSettings,
    TurnDone,
    TurnFailed,
    TurnSettings,
)

IVR_SENTENCE = (
    "Thank you for calling. Your order number four five seven two will arrive on "
    "Thursday, and you can press one to hear it again or two for an agent."
)
"""A typical dynamic IVR prompt (an order number and a date in it): about 8 s of speech."""
FRAME_S = 0.02


@dataclass
class Request:
    opened: float
    chunks: list[tuple[float, float]] = field(default_factory=list)
    """(arrival, seconds of audio before this chunk)"""
    audio_s: float = 0.0
    result: str = ""
    done: asyncio.Event = field(default_factory=asyncio.Event)

    def __call__(self, event: Event) -> None:
        self.received(event, time.monotonic())

    def received(self, event: Event, now: float) -> None:
        if isinstance(event, AudioReceived):
            fmt = event.audio_format
            self.chunks.append((now, self.audio_s))
            self.audio_s += len(event.audio) / (fmt.sample_rate_hz * fmt.bytes_per_sample)
        elif isinstance(event, TurnDone | TurnFailed | ProviderFailed):
            self.result = type(event).__name__ + (
                f":{event.kind}" if isinstance(event, TurnFailed | ProviderFailed) else ""
            )
            self.done.set()

    def figures(self) -> dict[str, float | str]:
        if not self.chunks:
            return {"result": self.result, "audio_s": 0.0}
        first = self.chunks[0][0]
        last = self.chunks[-1][0]
        gap = max(arrival - first - before for arrival, before in self.chunks)
        return {
            "result": self.result,
            "audio_s": round(self.audio_s, 3),
            "ttfa_s": round(first - self.opened, 3),
            "rtf": round((last - self.opened) / self.audio_s, 3),
            "gap_s": round(max(0.0, gap), 3),
        }


async def level(pool: ProviderPool, n: int, tag: str) -> dict[str, object]:
    speaker = Speaker([pool])
    requests = []
    t0 = time.monotonic()
    cpu0 = os.times()
    for i in range(n):
        req = Request(time.monotonic())
        requests.append(req)
        speaker.speak(f"{tag}-{i}", IVR_SENTENCE, TurnSettings("joe", PCM_8K), req)
    await asyncio.wait_for(asyncio.gather(*(r.done.wait() for r in requests)), 600)
    wall = time.monotonic() - t0
    cpu1 = os.times()
    per = [r.figures() for r in requests]
    ok = [p for p in per if p["result"] == "TurnDone"]
    audio = sum(float(p["audio_s"]) for p in ok)
    return {
        "concurrency": n,
        "completed": len(ok),
        "wall_s": round(wall, 3),
        "aggregate_x_realtime": round(audio / wall, 2) if wall else 0.0,
        "max_ttfa_s": max((float(p["ttfa_s"]) for p in ok), default=float("nan")),
        "max_rtf": max((float(p["rtf"]) for p in ok), default=float("nan")),
        "max_gap_s": max((float(p["gap_s"]) for p in ok), default=float("nan")),
        "client_cpu_s": round(
            (cpu1.user - cpu0.user) + (cpu1.system - cpu0.system), 3
        ),  # this process only
        "requests": per,
    }


def server_cpu_s(pid: int) -> float:
    """utime + stime of the server process (``/proc/PID/stat``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def run(args: argparse.Namespace) -> dict[str, object]:
    key = secrets.token_urlsafe(16)
    with tempfile.TemporaryDirectory() as d:
        port_file = Path(d) / "port"
        cmd = [
            *(sys.executable, "-m", "bridge.cli", "tts-server", "--engine", "piper"),
            *("--listen", "127.0.0.1:0", "--port-file", str(port_file)),
            *("--api-key-env", KEY_ENV, "--workers", str(args.workers)),
            *("--queue", "1000", "--max-wait-s", "600", "--nice", str(args.nice)),
        ]
        proc = subprocess.Popen(
            cmd, env={**os.environ, KEY_ENV: key}, stdout=subprocess.DEVNULL, stderr=sys.stderr
        )
        try:
            deadline = time.monotonic() + 120
            while not port_file.exists():
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit("tts-server did not start")
                await asyncio.sleep(0.05)
            port = int(port_file.read_text())
            url = f"ws://127.0.0.1:{port}{PROTOCOL_PATHS['kova']}"
            pool = ProviderPool(ProviderSettings("piper", "kova", url, api_key=key, voice="joe"))
            if not await pool.start(30):
                raise SystemExit("no connection to tts-server")
            await level(pool, 1, "warm")  # the first rendering loads what is lazy
            levels = []
            for n in args.concurrency:
                cpu0 = server_cpu_s(proc.pid)
                load = os.getloadavg()[0]
                result = await level(pool, n, f"n{n}")
                cpu = server_cpu_s(proc.pid) - cpu0
                result["server_cpu_s"] = round(cpu, 3)
                audio = sum(
                    float(r["audio_s"])  # type: ignore[index]
                    for r in result["requests"]  # type: ignore[attr-defined]
                )
                # seconds of audio per second of the server's CPU: real-time streams one
                # core can feed at most (a figure a busy shared host disturbs less)
                result["audio_s_per_cpu_s"] = round(audio / cpu, 2) if cpu else 0.0
                result["loadavg_1m_before"] = round(load, 2)
                result["real_time"] = (
                    result["completed"] == n
                    and float(str(result["max_ttfa_s"])) <= args.max_ttfa_s
                    and float(str(result["max_gap_s"])) <= FRAME_S
                )
                levels.append(result)
                print(
                    f"workers={args.workers} N={n:3d} x_rt={result['aggregate_x_realtime']:6.2f} "
                    f"ttfa_max={result['max_ttfa_s']:.3f}s rtf_max={result['max_rtf']:.3f} "
                    f"gap_max={result['max_gap_s']:.3f}s server_cpu={result['server_cpu_s']}s "
                    f"audio/cpu={result['audio_s_per_cpu_s']} "
                    f"real_time={result['real_time']} load={load:.2f}",
                    flush=True,
                )
            await pool.close()
        finally:
            proc.terminate()
            proc.wait(10)
    real = [int(str(lv["concurrency"])) for lv in levels if lv["real_time"]]
    return {
        "levels": levels,
        "max_real_time_concurrency": max(real, default=0),
        "sentence_audio_s": levels[0]["requests"][0]["audio_s"] if levels else 0,  # type: ignore[index]
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument(
        "--concurrency",
        type=lambda s: [int(x) for x in s.split(",")],
        default=[1, 2, 3, 4, 6, 8],
    )
    ap.add_argument("--max-ttfa-s", type=float, default=1.0)
    ap.add_argument("--nice", type=int, default=0)
    ap.add_argument("--out", default="")
    ap.add_argument(
        "--quick", action="store_true", help="make bench-quick: concurrency 1, 2, 4 only"
    )
    args = ap.parse_args()
    if args.quick:
        args.concurrency = [1, 2, 4]
        args.out = args.out or f"ttsd_w{args.workers}_quick"
    figures = asyncio.run(run(args))
    settings = {
        "workers": args.workers,
        "concurrency": args.concurrency,
        "max_ttfa_s": args.max_ttfa_s,
        "nice": args.nice,
        "text": IVR_SENTENCE,
        "protocol": "kova",
        "format": "pcm_s16le 8000",
        "host_cpus_usable": len(os.sched_getaffinity(0)),
    }
    path = write(args.out or f"ttsd_w{args.workers}", figures, settings)
    print(f"max real-time concurrency: {figures['max_real_time_concurrency']}  -> {path}")


if __name__ == "__main__":
    main()
