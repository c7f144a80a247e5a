"""How fast the host is right now, on the daemon's core: figures no project code moves.

The project's VM has run the same code 45 % slower from one hour to the next
(``docs/benchmarks.md``, section 3, "Seventeenth pass": no process in the
guest, no steal time reported), so a capacity figure alone does not say
whether a change or the host moved it. Each figure here is the median of
``reps`` runs of a fixed workload, in a child process pinned to ``core``
(the daemon's, ``procs.DAEMON_CORE``):

* ``python_loop_ns``: one iteration of a small pure-Python loop (the
  interpreter: CPU speed and the core's caches);
* ``memory_chase_ns``: one step of a chase through a random cycle over a
  64 MB array (each step's load depends on the last: memory latency, plus
  the interpreter's step, about 80 ns of it); ``cache_chase_ns``: the same
  over 4 MB, which the last-level cache holds when no other guest crowds
  it out; and ``memory_gather_ns``: one element of a random
  gather over a 128 MB array (numpy ``take``, loads in parallel): what a
  busy daemon's cold objects cost, DRAM and the last-level cache shared
  with the host's other guests;
* ``tcp_write_us``: one 309-byte ``send`` on a loopback TCP connection (a
  Twilio ``media`` message's size) while another process, pinned to the
  other core, reads it: the kernel's send and, on loopback, the reader's
  receive; ``tcp_write_200_us``: the same, a message to each of 200
  connections in turn, as the daemon's media writes go (each socket cold);
* ``stalls_per_min`` and ``longest_stall_ms``: how often, over ``stall_s``
  seconds after the workloads, the core itself did not run for more than
  ``STALL_MS`` (``watch``: a ``SCHED_FIFO`` thread sleeping 1 ms at a time,
  which no ordinary process can delay; the hypervisor can). ``None`` without
  the right to real-time priority. This is what bounds pacing: the tenth
  pass saw 3-9 such stalls a minute under load, the nineteenth 48 a minute
  with the machine idle.

``python -m bench.loadgen.hostspeed`` prints them; ``bench_capacity.py``
records them with every run (``host_speed``), before and after.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import selectors
import socket
import statistics
import sys
import time
from multiprocessing.connection import Connection
from typing import Any

MESSAGE_BYTES = 309  # a Twilio media message of 160 G.711 bytes, framed
_LOOP_N = 200_000
_GATHER_BYTES = 128 << 20
_GATHER_N = 1 << 20
_WRITES = 20_000
_CHASE_ITEMS = 16 << 20  # 4-byte items: 64 MB
_CACHE_CHASE_ITEMS = 1 << 20  # 4 MB
_CHASE_STEPS = 200_000
_CONNS = 200
STALL_MS = 2.5
"""A 1 ms sleep that lasts longer than this is a stall of the core (``watch``)."""
FIGURES = (
    "python_loop_ns",
    "memory_chase_ns",
    "cache_chase_ns",
    "memory_gather_ns",
    "tcp_write_us",
    "tcp_write_200_us",
)


def _python_loop_ns() -> float:
    t0 = time.perf_counter_ns()
    acc = 0
    for i in range(_LOOP_N):
        acc += i & 7
    elapsed = time.perf_counter_ns() - t0
    if acc != (_LOOP_N // 8) * 28:
        raise RuntimeError("python loop: wrong sum")
    return elapsed / _LOOP_N


def _chain(rng: Any, items: int) -> Any:
    """A random cycle through ``items`` items: ``a[i]`` is the next index."""
    from array import array

    import numpy as np

    order = rng.permutation(items).astype(np.int32)
    nxt = np.empty(items, dtype=np.int32)
    nxt[order] = np.roll(order, -1)
    return array("i", nxt.tobytes())


def _memory_chase_ns(chain: Any) -> float:
    i = 0
    t0 = time.perf_counter_ns()
    for _ in range(_CHASE_STEPS):
        i = chain[i]
    elapsed = time.perf_counter_ns() - t0
    if not 0 <= i < len(chain):
        raise RuntimeError("memory chase: index out of range")
    return elapsed / _CHASE_STEPS


def _memory_gather_ns(big: Any, index: Any) -> float:
    import numpy as np

    out = np.empty(len(index), dtype=big.dtype)
    t0 = time.perf_counter_ns()
    np.take(big, index, out=out)
    return (time.perf_counter_ns() - t0) / len(index)


def drain(port: int, conns: int, core: int | None = None) -> None:
    """Child process: open ``conns`` connections to ``port`` and read them all until EOF
    (pinned to ``core`` if given; ``bench_streams.py`` reads its shell's frames with it)."""
    if core is not None:
        os.sched_setaffinity(0, {core})
    sel = selectors.DefaultSelector()
    for _ in range(conns):
        sel.register(socket.create_connection(("127.0.0.1", port)), selectors.EVENT_READ)
    open_ = conns
    while open_:
        for key, _ in sel.select():
            sock = key.fileobj
            assert isinstance(sock, socket.socket)
            if not sock.recv(1 << 16):
                sel.unregister(sock)
                sock.close()
                open_ -= 1


def _tcp_write_us(conns: int, reader_core: int | None) -> float:
    """µs per ``send`` of a message to each of ``conns`` connections in turn (blocking)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(conns)
    child = multiprocessing.get_context("fork").Process(
        target=drain, args=(server.getsockname()[1], conns, reader_core)
    )
    child.start()
    socks = []
    for _ in range(conns):
        sock, _ = server.accept()
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        socks.append(sock)
    server.close()
    message = b"x" * MESSAGE_BYTES
    rounds = max(1, _WRITES // conns)
    sent = 0
    t0 = time.perf_counter_ns()
    for _ in range(rounds):
        for sock in socks:
            sent += sock.send(message)
    elapsed = time.perf_counter_ns() - t0
    for sock in socks:
        sock.close()
    child.join(10)
    if sent != rounds * conns * MESSAGE_BYTES:
        raise RuntimeError(f"tcp write: {sent} bytes sent of {rounds * conns * MESSAGE_BYTES}")
    return elapsed / (rounds * conns) / 1000


def watch(seconds: float, threshold_s: float, core: int | None) -> list[tuple[float, float]]:
    """(monotonic time at the end, length in ms) of every 1 ms sleep longer than the threshold.

    Run at ``SCHED_FIFO`` priority pinned to ``core``: it preempts any ordinary
    process the moment its timer fires, so only the core not running at all
    (another guest's vCPU, the guest kernel with interrupts off) delays it.
    This process keeps that priority: run it in a process of its own.
    Raises ``PermissionError`` without the right to real-time priority.
    """
    if core is not None:
        os.sched_setaffinity(0, {core})
    os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(20))
    stalls: list[tuple[float, float]] = []
    end = time.monotonic() + seconds
    while True:
        t0 = time.monotonic()
        time.sleep(0.001)
        t1 = time.monotonic()
        if t1 - t0 > threshold_s:
            stalls.append((round(t1, 4), round((t1 - t0) * 1e3, 2)))
        if t1 > end:
            return stalls


STALL_REACH_MS = 30.0
"""A stall ending this long before a late packet's arrival is taken as its cause: the
frame due in it, and the ones after it in the same wake-up, leave late."""


def watch_into(seconds: float, core: int | None, out: Connection) -> None:
    """``core``'s stalls over ``seconds`` (``watch``), sent through ``out``; None without
    the right to real-time priority. Run it in a child process."""
    try:
        out.send(watch(seconds, STALL_MS / 1e3, core))
    except PermissionError:
        out.send(None)
    out.close()


class StallWatch:
    """``watch_into`` in a child process for ``seconds`` from now, on ``core``;
    ``result()`` waits for it to end: the stalls, or None without real-time priority."""

    def __init__(self, seconds: float, core: int | None) -> None:
        ctx = multiprocessing.get_context("fork")
        self._end, child_end = ctx.Pipe(duplex=False)
        self._proc = ctx.Process(target=watch_into, args=(seconds, core, child_end))
        self._proc.start()

    def result(self) -> list[tuple[float, float]] | None:
        stalls: list[tuple[float, float]] | None = self._end.recv()
        self._proc.join(10)
        return stalls


def episodes_of(late_ns: list[int], gap_ms: float = 50.0) -> list[tuple[int, int]]:
    """Late packets grouped into episodes (a gap over ``gap_ms`` starts one):
    (first packet's time in ns, packets in it)."""
    out: list[tuple[int, int]] = []
    last = None
    for t in sorted(late_ns):
        if last is None or t - last > gap_ms * 1e6:
            out.append((t, 1))
        else:
            out[-1] = (out[-1][0], out[-1][1] + 1)
        last = t
    return out


def chance_pct(stalls: list[tuple[float, float]], seconds: float) -> float:
    """The share of random moments a stall ended within ``STALL_REACH_MS`` before."""
    return min(100.0, 100 * len(stalls) / seconds * STALL_REACH_MS / 1e3)


def stalls_before(
    excursion_ns: list[int], stalls: list[tuple[float, float]], reach_ms: float = STALL_REACH_MS
) -> list[float | None]:
    """For each excursion (monotonic ns), the longest stall (ms) that ended within
    ``reach_ms`` before it or overlaps it; None if there was none."""
    found: list[float | None] = []
    for t_ns in excursion_ns:
        t = t_ns / 1e9
        near = [ms for end, ms in stalls if t - reach_ms / 1e3 <= end <= t + ms / 1e3]
        found.append(max(near) if near else None)
    return found


def _stalls(seconds: float, core: int | None) -> dict[str, float | None]:
    if seconds <= 0:
        return {"stalls_per_min": None, "longest_stall_ms": None}
    try:
        stalls = watch(seconds, STALL_MS / 1e3, core)
    except PermissionError:
        return {"stalls_per_min": None, "longest_stall_ms": None}
    return {
        "stalls_per_min": round(len(stalls) * 60 / seconds, 1),
        "longest_stall_ms": max((ms for _, ms in stalls), default=0.0),
    }


def _measure(
    core: int | None, reader_core: int | None, reps: int, stall_s: float, out: Any
) -> None:
    """Child: the figures, pinned to ``core``, sent back through ``out``."""
    import numpy as np

    if core is not None:
        os.sched_setaffinity(0, {core})
    rng = np.random.default_rng(1)
    big = np.arange(_GATHER_BYTES // 8, dtype=np.int64)
    index = rng.integers(0, len(big), _GATHER_N)
    chain = _chain(rng, _CHASE_ITEMS)
    cache_chain = _chain(rng, _CACHE_CHASE_ITEMS)
    runs: dict[str, list[float]] = {key: [] for key in FIGURES}
    for _ in range(reps):
        runs["python_loop_ns"].append(_python_loop_ns())
        runs["memory_chase_ns"].append(_memory_chase_ns(chain))
        runs["cache_chase_ns"].append(_memory_chase_ns(cache_chain))
        runs["memory_gather_ns"].append(_memory_gather_ns(big, index))
        runs["tcp_write_us"].append(_tcp_write_us(1, reader_core))
        runs["tcp_write_200_us"].append(_tcp_write_us(_CONNS, reader_core))
    result: dict[str, Any] = {key: [round(v, 3) for v in values] for key, values in runs.items()}
    out.send((result, _stalls(stall_s, core)))  # last: the stall watch keeps real-time priority
    out.close()


def host_speed(
    core: int | None = 0, reader_core: int | None = 1, reps: int = 5, stall_s: float = 10.0
) -> dict[str, Any]:
    """The ``FIGURES`` (medians of ``reps`` runs, and the runs), measured on ``core``,
    then the core's stalls over ``stall_s`` seconds (0: not watched).

    ``None`` for a core: not pinned (a machine with one core).
    """
    cpus = os.cpu_count() or 1
    core = core if core is not None and core < cpus else None
    reader_core = reader_core if reader_core is not None and reader_core < cpus else None
    ctx = multiprocessing.get_context("fork")
    parent, child_end = ctx.Pipe(duplex=False)
    child = ctx.Process(target=_measure, args=(core, reader_core, reps, stall_s, child_end))
    child.start()
    child_end.close()
    runs: dict[str, list[float]]
    runs, stalls = parent.recv()
    child.join(30)
    if child.exitcode != 0:
        raise RuntimeError(f"host speed: the measuring process exited with {child.exitcode}")
    figures: dict[str, Any] = {key: statistics.median(values) for key, values in runs.items()}
    figures.update(stalls)
    figures["runs"] = runs
    figures["core"] = core
    return figures


def describe(figures: dict[str, Any]) -> str:
    return (
        f"host speed (core {figures['core']}): python loop {figures['python_loop_ns']:.1f} ns,"
        f" memory chase {figures['memory_chase_ns']:.1f} ns"
        f" (4 MB: {figures['cache_chase_ns']:.1f}),"
        f" gather {figures['memory_gather_ns']:.1f} ns,"
        f" tcp write {figures['tcp_write_us']:.2f} µs"
        f" (200 sockets: {figures['tcp_write_200_us']:.2f})"
        + (
            f", stalls over {STALL_MS} ms {figures['stalls_per_min']:.0f} a minute"
            f" (longest {figures['longest_stall_ms']:.1f} ms)"
            if figures.get("stalls_per_min") is not None
            else ""
        )
    )


if __name__ == "__main__":
    result = host_speed()
    print(describe(result))
    if "--json" in sys.argv:
        print(json.dumps(result))
