"""The processes under test: a TTS server and a ``callbridge serve`` daemon, pinned to cores.

``DaemonUnderTest`` writes a generated config, starts ``callbridge serve``
(uvloop) pinned to core 0, waits for ``/readyz``, and reads what the
benchmarks need from outside: ``/metrics``, the CDR lines (``call.ended``)
of its log, ``/proc/<pid>`` (CPU ticks, RSS, fds, threads). ``TtsProcess``
runs ``bench/loadgen/ttsd_proc.py`` (the reference TTS server with the
``tone`` engine, which also records when it produced each job's first chunk)
pinned to the load generator's core.

Both can run the code of another source tree (a git worktree with local
changes, e.g. a diagnostic's instrumentation) with this venv: pass ``src``,
or set ``BENCH_SOURCE_TREE`` for every process a benchmark starts. The tree's
``bridge`` and ``codecs/telcodec`` then come first on the child's
``PYTHONPATH``, ahead of the editable install of this checkout.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent
DAEMON_CORE = 0
LOADGEN_CORE = 1
CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")

_PANGRAM = "the quick brown fox jumps over the lazy dog while seven wizards quietly judge boxing"
TALK_TEXT = " ".join([_PANGRAM.capitalize() + "."] * 6)
"""About 15 s of tone audio per turn, in six sentences (so the daemon's text pacing can send
it a sentence at a time, as it does a real turn; through the nineteenth pass the bench's turn
was one 509-character sentence, which a provider only speaks whole)."""


SOURCE_TREE_ENV = "BENCH_SOURCE_TREE"


def source_tree_env(src: Path | None = None) -> dict[str, str]:
    """Environment additions for a child that runs ``src``'s code (default: ``BENCH_SOURCE_TREE``).

    Empty when neither is given: the child imports this checkout (the editable install).
    """
    if src is None:
        named = os.environ.get(SOURCE_TREE_ENV, "")
        if not named:
            return {}
        src = Path(named)
    src = src.resolve()
    if not (src / "bridge" / "__init__.py").exists():
        raise ValueError(f"{src} is not a callbridge source tree (no bridge/__init__.py)")
    paths = [str(src), str(src / "codecs")]
    if os.environ.get("PYTHONPATH"):
        paths.append(os.environ["PYTHONPATH"])
    return {"PYTHONPATH": os.pathsep.join(paths)}


def free_port(kind: int = socket.SOCK_STREAM) -> int:
    with socket.socket(socket.AF_INET, kind) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def pin_self(core: int = LOADGEN_CORE) -> None:
    """Pin the calling process (the load generator) to one core."""
    if (os.cpu_count() or 1) > core:
        os.sched_setaffinity(0, {core})


def _pinned(core: int) -> Any:
    def pre() -> None:
        if (os.cpu_count() or 1) > core:
            os.sched_setaffinity(0, {core})

    return pre


@dataclass
class TtsProcess:
    """The reference TTS server (tone engine) in its own process."""

    proc: subprocess.Popen[bytes]
    port: int
    record_path: Path

    @classmethod
    def start(
        cls,
        workdir: Path,
        core: int = LOADGEN_CORE,
        *,
        src: Path | None = None,
        env: dict[str, str] | None = None,
    ) -> TtsProcess:
        port_file = workdir / "ttsd.port"
        record = workdir / "ttsd_first_chunks.json"
        port_file.unlink(missing_ok=True)
        proc = subprocess.Popen(
            [sys.executable, str(ROOT / "bench/loadgen/ttsd_proc.py"), str(port_file), str(record)],
            preexec_fn=_pinned(core),
            start_new_session=True,
            stdout=subprocess.DEVNULL,
            stderr=open(workdir / "ttsd.log", "wb"),  # noqa: SIM115 - the child owns it
            env={**os.environ, **source_tree_env(src), **(env or {})},
        )
        deadline = time.monotonic() + 20
        while not port_file.exists() or not port_file.read_text().strip():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"ttsd did not start; see {workdir / 'ttsd.log'}")
            time.sleep(0.05)
        return cls(proc, int(port_file.read_text()), record)

    def first_chunks(self) -> list[tuple[str, float]]:
        """(text, monotonic time) of every job's first audio chunk (after ``stop``)."""
        if not self.record_path.exists():
            return []
        return [(t, float(s)) for t, s in json.loads(self.record_path.read_text())]

    def stop(self) -> None:
        terminate(self.proc, 10)


def config_text(
    tts_port: int,
    sip_port: int,
    ms_port: int,
    api_port: int,
    *,
    pcm24k: bool = False,
    rtp_ports: str = "30000-33999",
    lead_ms: int = 60,
    max_loop_lag_ms: float = 0,
    daemon_extra: str = "",
    provider_extra: str = "",
    sip_extra: str = "",
    extra: str = "",
) -> str:
    """The daemon's config for a benchmark.

    ``max_loop_lag_ms`` is off (0) by default: the benchmarks look for where
    pacing fails, and a neighbour on the shared machine would otherwise make
    the daemon shed the very calls a step needs (503, overloaded).
    ``daemon_extra``: more ``[daemon]`` lines (TOML), for diagnostics;
    ``provider_extra``: more lines for the provider (e.g. ``flow_control_ahead_s``);
    ``sip_extra``: more ``[sip]`` lines (a TLS listener); ``extra``: tables appended at the
    end (``[trunks.NAME]``).
    """
    fmt = 'encoding = "pcm"\nsample_rate = 24000\n' if pcm24k else ""
    return f"""
[daemon]
log_format = "json"
log_level = "info"
event_loop = "uvloop"
drain_timeout_s = 1
prompt_cache_bytes = 0
max_loop_lag_ms = {max_loop_lag_ms}
{daemon_extra}
[sip]
listen = ["127.0.0.1:{sip_port}"]
transports = ["udp"]
rtp_ports = "{rtp_ports}"
max_calls = 5000
invite_rate_per_source = 100000
rtp_timeout_s = 60
{sip_extra}
[media_streams]
listen = "127.0.0.1:{ms_port}"
lead_ms = {lead_ms}
max_message_bytes = 1048576
max_connections = 8192
max_connections_per_source = 8192

[api]
listen = "127.0.0.1:{api_port}"

[providers.fast]
protocol = "kova"
url = "ws://127.0.0.1:{tts_port}/v1/ws/kova"
api_key = "k"
voice = "tone"
{fmt}{provider_extra}
[flows.talk]
start = "talk"

[flows.talk.steps.talk]
say = "{TALK_TEXT}"
next = "talk"

[[routes]]
match = "talk"
provider = "fast"
flow = "talk"

[[routes]]
match = "*"
provider = "fast"
greeting = "hello and welcome to the latency benchmark"
{extra}"""


@dataclass
class DaemonUnderTest:
    """``callbridge serve`` in its own process, pinned to ``DAEMON_CORE``."""

    proc: subprocess.Popen[bytes]
    workdir: Path
    sip_port: int
    ms_port: int
    api_port: int
    tls_port: int = 0
    """The SIP TLS listener's port (``tls``: certificate and key given), else 0."""

    @classmethod
    def start(
        cls,
        workdir: Path,
        tts_port: int,
        *,
        pcm24k: bool = False,
        env: dict[str, str] | None = None,
        core: int = DAEMON_CORE,
        lead_ms: int = 60,
        daemon_extra: str = "",
        provider_extra: str = "",
        src: Path | None = None,
        tls: tuple[Path, Path] | None = None,
        sip_extra: str = "",
        extra: str = "",
    ) -> DaemonUnderTest:
        """``tls``: (certificate, key) files: a SIP TLS listener on a free port (``tls_port``);
        ``sip_extra`` / ``extra``: as ``config_text``'s."""
        sip, ms, api = free_port(socket.SOCK_DGRAM), free_port(), free_port()
        tls_port = 0
        if tls is not None:
            tls_port = free_port()
            sip_extra = (
                f'tls_listen = ["127.0.0.1:{tls_port}"]\n'
                f'tls_certificate_file = "{tls[0]}"\ntls_key_file = "{tls[1]}"\n{sip_extra}'
            )
        cfg = workdir / "callbridge.toml"
        cfg.write_text(
            config_text(
                tts_port,
                sip,
                ms,
                api,
                pcm24k=pcm24k,
                lead_ms=lead_ms,
                daemon_extra=daemon_extra,
                provider_extra=provider_extra,
                sip_extra=sip_extra,
                extra=extra,
            )
        )
        proc = subprocess.Popen(
            [str(VENV_BIN / "callbridge"), "serve", "--config", str(cfg)],
            preexec_fn=_pinned(core),
            start_new_session=True,
            stdout=subprocess.DEVNULL,
            stderr=open(workdir / "daemon.log", "wb"),  # noqa: SIM115 - the child owns it
            env={**os.environ, **source_tree_env(src), **(env or {})},
        )
        d = cls(proc, workdir, sip, ms, api, tls_port)
        deadline = time.monotonic() + 30
        while True:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"daemon did not become ready; see {workdir / 'daemon.log'}")
            try:
                if d.http("/readyz").startswith("{"):
                    break
            except OSError:
                time.sleep(0.1)
        return d

    @property
    def pid(self) -> int:
        return self.proc.pid

    def http(self, path: str) -> str:
        url = f"http://127.0.0.1:{self.api_port}{path}"
        with urllib.request.urlopen(url, timeout=5) as r:
            return str(r.read().decode())

    def metric_samples(self, name: str) -> dict[str, float]:
        """Every sample line of ``name`` on ``/metrics`` (full sample name with labels → value)."""
        out: dict[str, float] = {}
        for line in self.http("/metrics").splitlines():
            if line.startswith(name):
                key, _, value = line.rpartition(" ")
                out[key] = float(value)
        return out

    def active_calls(self) -> int:
        """Calls in progress (``callbridge_calls_active``, every leg and route)."""
        return round(sum(self.metric_samples("callbridge_calls_active").values()))

    def wait_calls_ended(self, timeout_s: float = 90.0) -> dict[str, float]:
        """Wait until no call is in progress: a step must not start while the previous
        one's calls are still being torn down (their hang-ups wait in the daemon's
        sockets under load). Returns the calls found at first and the seconds waited."""
        t0 = time.monotonic()
        first = left = self.active_calls()
        while left and time.monotonic() - t0 < timeout_s:
            time.sleep(0.25)
            left = self.active_calls()
        return {
            "calls_left_from_before": first,
            "calls_left_wait_s": round(time.monotonic() - t0, 2),
            "calls_left_at_start": left,
        }

    def cpu_s(self) -> float:
        """utime + stime of the daemon so far, in seconds (``/proc/<pid>/stat``)."""
        fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLK_TCK

    def rss_bytes(self) -> int:
        return int(Path(f"/proc/{self.pid}/statm").read_text().split()[1]) * PAGE_BYTES

    def fd_count(self) -> int:
        return len(os.listdir(f"/proc/{self.pid}/fd"))

    def thread_count(self) -> int:
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("Threads:"):
                return int(line.split()[1])
        return 0

    def log_events(self, event: str) -> list[dict[str, Any]]:
        """Every line of one event (``call.ended``, ``gc.thaw`` ...) in the daemon's JSON log."""
        out = []
        for line in (self.workdir / "daemon.log").read_text(errors="replace").splitlines():
            if f'"{event}"' in line:
                try:
                    out.append(json.loads(line))
                except ValueError:
                    continue
        return out

    def cdr_lines(self) -> list[dict[str, Any]]:
        """Every ``call.ended`` line of the daemon's JSON log."""
        return self.log_events("call.ended")

    def stop(self) -> None:
        terminate(self.proc, 15)


def terminate(proc: subprocess.Popen[Any], grace_s: float) -> None:
    """SIGTERM (a daemon drains and exits), then SIGKILL after ``grace_s``."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def cpu_pct(used_s: float, wall_s: float) -> float:
    return round(100.0 * used_s / wall_s, 1) if wall_s > 0 else float("nan")
