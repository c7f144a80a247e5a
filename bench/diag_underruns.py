"""Whose underruns, and which step of the provider → playout path holds a turn back.

Not a benchmark (``run_all.py`` runs only ``bench_*.py``): a diagnostic for
the capacity steps' underrun counts. It runs ``n`` SIP calls of the capacity
workload (route ``talk``: a ~15 s turn said again and again, Kova from the
reference server's tone engine) for ``seconds``, hangs up, and prints the
calls' underruns (their CDRs) next to what the reference server noted for
every turn it finished (``bench/loadgen/ttsd_proc.py``): how far its
production of that turn fell behind real time, i.e. the largest
``(t_k - t_0) - audio before chunk k`` over the turn's chunks. A turn produced
more than a frame behind can run dry at the daemon whatever the daemon does.

The server also notes every audio message it writes (``TTSD_RECORD_CHUNKS``).
With ``--src TREE`` the daemon runs that source tree's code (a git worktree);
if that tree carries the local h4 instrumentation (``bridge/io/h4trace.py``,
``/work/prompts/s5/h4_instrument.patch``: it is never committed), the daemon
is started with ``CB_H4_TRACE`` and notes, on CLOCK_MONOTONIC like the server,
each provider read (``data_received``: bytes, messages, the kernel's bytes
still queued after it, the ticker time spent at its preemption points), each
audio message's hand-over to its turn, each push into a playout queue, each
ticker run, and each underrun (call, turn, position). For every underrun
episode (consecutive dry ticks of one turn) the report then gives the message
that would have filled it and when it was produced and written by the server,
read from the socket by the daemon, handed to the call and pushed to the
playout queue, and which of those steps came after the first dry tick:

* ``server``: produced after the turn ran dry (the provider is late);
* ``socket``: written in time, read late (the daemon's loop did not read the
  connection: busy elsewhere, or the message sat behind others in the kernel);
* ``read``: read in time, handed to the call late (it waited behind the other
  messages of the same read);
* ``call``: handed over in time, pushed to the queue late;
* ``none``: pushed before the dry tick (should not happen).

Also per episode: the turn's position (frames played; after how long), how
much it had queued in the second before, how far ahead of real time the
server was with that chunk, and the turn's start against the previous turn's
end (is the underrun at a turn's start or mid-turn?). ``--keep DIR`` keeps the
raw records (and the daemon's and the server's logs); ``--analyze DIR`` re-reads
them without running anything.

    python -m bench.diag_underruns [--calls 400] [--seconds 25] [--pcm24k] [--src /work/wt-h4]

``--restart-demo TURNS`` runs nothing of the above: it shows, in-process, what
a turn restarted on a busy provider connection waits behind, with the
connection's flow control off and on (``restart_demo``).
"""

from __future__ import annotations

import argparse
import collections
import itertools
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.loadgen.procs import DAEMON_CORE, DaemonUnderTest, TtsProcess, pin_self
from bench.loadgen.rtp import RtpLoad
from bench.loadgen.steps import _core0, core_busy_s

FRAME_S = 0.02
SAMPLES_PER_FRAME = 160
STEPS = ("server", "socket", "read", "call", "none")


def run(args: argparse.Namespace, out: Path) -> dict[str, Any]:
    """One run; raw records land in ``out``. Returns the run's context figures."""
    src = Path(args.src).resolve() if args.src else None
    traced = src is not None and (src / "bridge/io/h4trace.py").exists()
    trace = out / "daemon_trace.jsonl"
    with tempfile.TemporaryDirectory() as tmp:
        tts = TtsProcess.start(Path(tmp), src=src, env={"TTSD_RECORD_CHUNKS": "1"})
        env = {"CB_H4_TRACE": str(trace)} if traced else {}
        d = DaemonUnderTest.start(Path(tmp), tts.port, src=src, env=env, pcm24k=args.pcm24k)
        try:
            load = RtpLoad(("127.0.0.1", d.sip_port), route="talk")
            t_place = time.monotonic()
            load.place(args.calls, rate_per_s=150)
            answered = load.wait_answered(20)
            k0, c0, t0 = core_busy_s(DAEMON_CORE), d.cpu_s(), time.monotonic()
            load.run_for(args.seconds)
            k1, c1, t1 = core_busy_s(DAEMON_CORE), d.cpu_s(), time.monotonic()
            ids = {c.call_id for c in load.calls}
            load.hangup_all(settle_s=1.5)
            load.close()
        finally:
            d.stop()
            tts.stop()
        cdrs = [c for c in d.cdr_lines() if c["call_id"] in ids]
        (out / "cdrs.json").write_text(json.dumps(cdrs))
        for log in ("daemon.log", "ttsd.log"):
            shutil.copy(Path(tmp) / log, out / log)
        for suffix in (".jobs.json", ".chunks.json"):
            p = tts.record_path.with_suffix(suffix)
            if p.exists():
                shutil.copy(p, out / f"ttsd{suffix}")
    context = {
        "calls": args.calls,
        "answered": answered,
        "seconds": args.seconds,
        "src": str(src) if src else "",
        "traced": traced,
        "placed_at": t_place,
        "window": [t0, t1],
        "daemon_cpu_pct": round(100 * (c1 - c0) / (t1 - t0), 1),
        **_core0(k0, k1, c1 - c0, t1 - t0),
        "loadavg": os.getloadavg(),
    }
    (out / "context.json").write_text(json.dumps(context))
    return context


def _load(out: Path) -> dict[str, Any]:
    data: dict[str, Any] = {"context": {}, "cdrs": [], "jobs": [], "chunks": []}
    for key, name in (
        ("context", "context.json"),
        ("cdrs", "cdrs.json"),
        ("jobs", "ttsd.jobs.json"),
        ("chunks", "ttsd.chunks.json"),
    ):
        p = out / name
        if p.exists():
            data[key] = json.loads(p.read_text())
    rows: dict[str, list[list[Any]]] = collections.defaultdict(list)
    trace = out / "daemon_trace.jsonl"
    if trace.exists():
        for line in trace.read_text().splitlines():
            row = json.loads(line)
            rows[row[0]].append(row[1:])
    data["trace"] = rows
    return data


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, int(q * (len(s) - 1) + 0.5))]


def _summary(values: list[float], scale: float = 1.0, nd: int = 1) -> str:
    if not values:
        return "-"
    return (
        f"p50 {_pct(values, 0.5) * scale:.{nd}f} p90 {_pct(values, 0.9) * scale:.{nd}f}"
        f" p99 {_pct(values, 0.99) * scale:.{nd}f} max {max(values) * scale:.{nd}f}"
    )


def episodes(underruns: list[list[Any]]) -> list[dict[str, Any]]:
    """Consecutive dry ticks of one turn at one position, as one episode each."""
    by_turn: dict[tuple[str, str], list[list[Any]]] = collections.defaultdict(list)
    for u in underruns:
        by_turn[(u[1], u[2])].append(u)
    eps: list[dict[str, Any]] = []
    for (call, turn), us in by_turn.items():
        us.sort()
        cur: dict[str, Any] | None = None
        for t, _, _, played, pushed, pending, audio_open, in_preempt in us:
            if cur is not None and cur["played_frames"] == played:
                cur["ticks"] += 1
                cur["t_last"] = t
                continue
            cur = {
                "call": call,
                "turn": turn,
                "t": t,
                "t_last": t,
                "ticks": 1,
                "played_frames": played,
                "pushed_frames": pushed,
                "pending_bytes": pending,
                "audio_open": audio_open,
                "tick_from_preempt": in_preempt,
            }
            eps.append(cur)
    eps.sort(key=lambda e: e["t"])
    return eps


def analyze(data: dict[str, Any]) -> dict[str, Any]:
    tr = data["trace"]
    wire_of: dict[tuple[str, str], str] = {}
    turn_of: dict[str, tuple[str, str]] = {}
    opened: dict[tuple[str, str], float] = {}
    ctx_of: dict[str, str] = {}  # wire id -> "<port>/<context id>" (the server's name)
    for t, call, turn, wire, ctx in tr.get("open", []):
        wire_of[(call, turn)] = wire
        turn_of[wire] = (call, turn)
        ctx_of[wire] = ctx
        opened[(call, turn)] = t
    # the server's chunks per context, in order: [t_prod, t_write, samples, wbuf, outq]
    srv: dict[str, list[list[Any]]] = collections.defaultdict(list)
    srv_done: dict[str, float] = {}
    for t_prod, t_write, ctx, samples, wbuf, outq in data["chunks"]:
        if samples < 0:
            srv_done[ctx] = t_write
        elif samples > 0:
            srv[ctx].append([t_prod, t_write, samples, wbuf, outq])
    reads = {r[1]: r for r in tr.get("read", [])}  # idx -> [conn, idx, t_in, t_out, ...]
    dmsgs: dict[str, list[list[Any]]] = collections.defaultdict(list)
    ddone: dict[str, float] = {}
    for t, ridx, kind, wire, nbytes in tr.get("msg", []):
        if kind == "a":
            dmsgs[wire].append([t, ridx, nbytes])
        else:
            ddone[wire] = t
    pushes: dict[tuple[str, str], list[list[Any]]] = collections.defaultdict(list)
    for t, call, turn, kept, pushed, played in tr.get("push", []):
        pushes[(call, turn)].append([t, kept, pushed, played])
    started = {(c, tu): t for t, c, tu in tr.get("start", [])}
    finished = {(c, tu): (t, n) for t, c, tu, n in tr.get("finish", [])}
    # previous turn of each call (flow turns: flow-talk-1, -2, ...)
    turns_by_call: dict[str, list[tuple[float, str]]] = collections.defaultdict(list)
    for (call, turn), t in opened.items():
        turns_by_call[call].append((t, turn))
    prev_turn: dict[tuple[str, str], str] = {}
    for call, ts in turns_by_call.items():
        ts.sort()
        for (_, a), (_, b) in itertools.pairwise(ts):
            prev_turn[(call, b)] = a

    eps = episodes(tr.get("underrun", []))
    step_counts: collections.Counter[str] = collections.Counter()
    step_ticks: collections.Counter[str] = collections.Counter()
    detail: list[dict[str, Any]] = []
    for ep in eps:
        key = (ep["call"], ep["turn"])
        wire = wire_of.get(key, "")
        chunks = srv.get(ctx_of.get(wire, ""), [])
        need = (ep["played_frames"] + 1) * SAMPLES_PER_FRAME  # samples for one more frame
        cum, k = 0, -1
        for i, c in enumerate(chunks):
            cum += c[2]
            if cum >= need:
                k = i
                break
        e: dict[str, Any] = dict(ep)
        e["wire"] = wire
        e["chunk_index"] = k
        e["chunks_in_turn"] = len(chunks)
        t_start = started.get(key)
        e["since_start_s"] = None if t_start is None else round(ep["t"] - t_start, 3)
        if chunks:
            first = chunks[0][0]
            e["turn_audio_s"] = round(sum(c[2] for c in chunks) / 8000, 2)
            e["playout_start_after_server_first_ms"] = (
                None if t_start is None else round(1000 * (t_start - first), 1)
            )
        if k >= 0:
            c = chunks[k]
            before = sum(x[2] for x in chunks[:k]) / 8000
            e["server_ahead_ms"] = round(1000 * (before - (c[0] - chunks[0][0])), 1)
            e["server_write_buffer_bytes"], e["server_kernel_unsent_bytes"] = c[3], c[4]
            rel = {"produced": c[0], "written": c[1]}
            msgs = dmsgs.get(wire, [])
            if k < len(msgs):
                t_disp, ridx, _ = msgs[k]
                r = reads.get(ridx)
                if r is not None:
                    rel["read"] = r[2]
                    rel["read_done"] = r[3]
                    e["read"] = {
                        "bytes": r[4],
                        "kernel_left_bytes": r[5],
                        "messages": r[6],
                        "ticker_ms": round(1000 * r[7], 2),
                        "took_ms": round(1000 * (r[3] - r[2]), 2),
                    }
                rel["handed"] = t_disp
            for t_p, _, pushed, _ in pushes.get(key, []):
                if pushed > ep["played_frames"]:
                    rel["pushed"] = t_p
                    break
            e["ms_after_dry"] = {name: round(1000 * (v - ep["t"]), 1) for name, v in rel.items()}
            order = [
                ("server", rel.get("produced")),
                ("socket", rel.get("read")),
                ("read", rel.get("handed")),
                ("call", rel.get("pushed")),
            ]
            step = "none"
            for name, v in order:
                if v is not None and v > ep["t"]:
                    step = name
                    break
            e["late_step"] = step
        else:
            e["late_step"] = "no chunk" if chunks else "no server record"
        # queued frames of the turn in the second before the dry tick (after each push)
        hist = [
            (round(1000 * (t - ep["t"])), pushed - played)
            for t, _, pushed, played in pushes.get(key, [])
            if ep["t"] - 1.0 <= t < ep["t"]
        ]
        e["queued_after_pushes_1s_before"] = hist[-8:]
        prev = prev_turn.get(key)
        if prev is not None and (ep["call"], prev) in finished:
            e["prev_turn_finished_ms_before_open"] = round(
                1000 * (opened[key] - finished[(ep["call"], prev)][0]), 1
            )
        step_counts[e["late_step"]] += 1
        step_ticks[e["late_step"]] += ep["ticks"]
        detail.append(e)

    # every turn: how far ahead of its playout the audio was at each hand-over
    margins: list[float] = []
    first_margin: list[float] = []
    gaps: list[float] = []
    for (call, turn), t_start in started.items():
        wire = wire_of.get((call, turn), "")
        got = 0
        for i, (t, _, nbytes) in enumerate(dmsgs.get(wire, [])):
            if i:
                m = got / 8000 - (t - t_start)
                margins.append(m)
                if i == 1:
                    first_margin.append(m)
            got += nbytes
        prev = prev_turn.get((call, turn))
        if prev is not None and (call, prev) in finished:
            gaps.append(t_start - finished[(call, prev)][0])
    # a turn's start, step by step: the flow's next say, the server, the socket, the call
    start_steps: dict[str, list[float]] = collections.defaultdict(list)
    second_steps: dict[str, list[float]] = collections.defaultdict(list)
    for key, t_open in opened.items():
        wire = wire_of[key]
        chunks = srv.get(ctx_of.get(wire, ""), [])
        msgs = dmsgs.get(wire, [])
        if not chunks or not msgs or key not in started:
            continue
        first_read = reads.get(msgs[0][1])
        start_steps["open_to_server_produced"].append(chunks[0][0] - t_open)
        start_steps["server_written_to_read"].append(
            (first_read[2] if first_read else msgs[0][0]) - chunks[0][1]
        )
        t_read = first_read[2] if first_read else msgs[0][0]
        start_steps["read_to_handed"].append(msgs[0][0] - t_read)
        start_steps["handed_to_first_frame"].append(started[key] - msgs[0][0])
        if len(chunks) > 1 and len(msgs) > 1:
            second_read = reads.get(msgs[1][1])
            second_steps["server_second_after_first"].append(chunks[1][1] - chunks[0][1])
            second_steps["daemon_second_after_first"].append(msgs[1][0] - msgs[0][0])
            if second_read:
                second_steps["second_written_to_read"].append(second_read[2] - chunks[1][1])
    rs = tr.get("read", [])
    ticks = tr.get("tick", [])
    return {
        "episodes": len(eps),
        "underrun_ticks": sum(e["ticks"] for e in eps),
        "late_step_episodes": dict(step_counts),
        "late_step_ticks": dict(step_ticks),
        "detail": detail,
        "turns_started": len(started),
        "margin_at_handover_ms": _summary(margins, 1000),
        "margin_at_second_message_ms": _summary(first_margin, 1000),
        "lowest_margins_ms": [round(1000 * m, 1) for m in sorted(margins)[:10]],
        "gap_between_turns_ms": _summary(gaps, 1000),
        "turn_start_ms": {k: _summary(v, 1000) for k, v in start_steps.items()},
        "second_message_ms": {k: _summary(v, 1000) for k, v in second_steps.items()},
        "reads": {
            "n": len(rs),
            "bytes": _summary([r[4] for r in rs], 1, 0),
            "messages": _summary([r[6] for r in rs], 1, 0),
            "took_ms": _summary([r[3] - r[2] for r in rs], 1000, 2),
            "kernel_left_bytes": _summary([r[5] for r in rs], 1, 0),
            "ticker_ms": _summary([r[7] for r in rs], 1000, 2),
            "ticker_share_of_reads_over_100_messages": round(
                sum(r[7] for r in rs if r[6] > 100)
                / max(1e-9, sum(r[3] - r[2] for r in rs if r[6] > 100)),
                3,
            ),
        },
        "ticker_runs": {
            "timer": sum(1 for t in ticks if t[2] == "r"),
            "preempt": sum(1 for t in ticks if t[2] == "p"),
            "took_ms": _summary([t[1] - t[0] for t in ticks], 1000, 2),
        },
    }


def report(data: dict[str, Any]) -> dict[str, Any]:
    ctx, cdrs, jobs = data["context"], data["cdrs"], data["jobs"]
    runs_dry = [int(c.get("underruns", 0)) for c in cdrs]
    out: dict[str, Any] = {"context": ctx, "underrun_frames_cdr": sum(runs_dry)}
    print(
        f"context: {json.dumps({k: v for k, v in ctx.items() if k not in ('window', 'placed_at')})}"
    )
    print(
        f"{len(cdrs)} calls: {sum(runs_dry)} underrun frames on {sum(1 for u in runs_dry if u)}"
        f" calls (most on one call: {max(runs_dry, default=0)})"
    )
    ttfa = [float(v) for c in cdrs for v in c.get("time_to_first_audio_ms", [])]
    out["time_to_first_audio_ms"] = _summary(ttfa)
    print(f"time to first audio of the calls' turns (CDRs): {out['time_to_first_audio_ms']} ms")
    behind = sorted(b for _, audio_s, b in jobs if audio_s > 1.0)
    if behind:
        over = [b for b in behind if b > FRAME_S]
        print(
            f"{len(behind)} finished turns at the provider: {len(over)} produced more than one"
            f" frame behind real time; most behind {behind[-1] * 1000:.1f} ms,"
            f" p99 {behind[int(0.99 * (len(behind) - 1))] * 1000:.1f} ms,"
            f" median {behind[len(behind) // 2] * 1000:.1f} ms"
        )
    if not data["trace"]:
        return out
    a = analyze(data)
    out["analysis"] = a
    print(
        f"traced: {a['underrun_ticks']} dry ticks in {a['episodes']} episodes;"
        f" late step (episodes) {a['late_step_episodes']}, (ticks) {a['late_step_ticks']}"
    )
    print(f"turns started {a['turns_started']}; gap between turns {a['gap_between_turns_ms']} ms")
    for k, v in a["turn_start_ms"].items():
        print(f"  turn start, {k}: {v} ms")
    for k, v in a["second_message_ms"].items():
        print(f"  second message, {k}: {v} ms")
    print(f"margin (audio ahead of playout) at each hand-over: {a['margin_at_handover_ms']} ms")
    print(f"  at a turn's second message: {a['margin_at_second_message_ms']} ms")
    print(f"  lowest: {a['lowest_margins_ms']}")
    print(f"provider reads: {json.dumps(a['reads'])}")
    print(f"ticker runs: {json.dumps(a['ticker_runs'])}")
    if a["detail"]:
        pos = [e["played_frames"] for e in a["detail"]]
        since = [e["since_start_s"] for e in a["detail"] if e["since_start_s"] is not None]
        print(
            f"episode position: frames played {_summary(pos, 1, 0)};"
            f" s since the turn's first frame {_summary(since, 1, 2)}"
        )
        ahead = [e["server_ahead_ms"] for e in a["detail"] if "server_ahead_ms" in e]
        if ahead:
            print(f"server ahead of real time with the chunk: {_summary(ahead, 1, 1)} ms")
        for e in a["detail"][:12]:
            print(
                f"  {e['call'][:10]} {e['turn']} dry x{e['ticks']} at frame {e['played_frames']}"
                f" (+{e['since_start_s']} s) step={e['late_step']} chunk {e['chunk_index']}"
                f" {e.get('ms_after_dry')} read={e.get('read')}"
                f" queued={e['queued_after_pushes_1s_before'][-3:]}"
            )
        med = statistics.median(e["ticks"] for e in a["detail"])
        print(f"  ... median episode {med} ticks")
    return out


def restart_demo(turns: int, wait_s: float = 2.0, reps: int = 3) -> None:
    """Whose audio comes before a restarted turn's first audio on a busy connection.

    The reference server (tone engine) and one ``ProviderPool`` in this
    process: ``turns`` turns of the capacity text open at once on one Kova
    connection, and ``wait_s`` later one more turn opens on it. Printed: the
    other turns' audio handed over between its open and its first audio (the
    provider's FIFO in front of it: a count, repeatable), and that wait's wall
    time (an idle loop: indicative only), with flow control off (the pool's
    default) and on (``flow_high_s=FLOW_HIGH_S``). ``turns`` below the
    protocol's 64, or the new turn gets a connection of its own.
    """
    import asyncio

    from bench.loadgen.procs import TALK_TEXT
    from bridge.io.embedded import PROTOCOL_PATHS
    from bridge.io.provider_pool import FLOW_HIGH_S, ProviderPool
    from bridge.io.ttsd_server import start_tts_server
    from bridge.providers.base import MULAW_8K, AudioReceived, ProviderSettings, TurnSettings

    bytes_per_s = 8000  # mu-law 8 kHz
    turn = TurnSettings("tone", MULAW_8K)

    async def one(flow_high_s: float | None) -> str:
        server = await start_tts_server(engine="tone")
        url = f"ws://127.0.0.1:{server.port}{PROTOCOL_PATHS['kova']}"
        settings = ProviderSettings("p", "kova", url, api_key="k", voice="tone")
        pool = ProviderPool(settings, flow_high_s=flow_high_s)
        assert await pool.start()
        seen: dict[str, Any] = {"opened": None, "first": None, "before": 0}

        def sink_for(name: str) -> Any:
            def sink(e: Any) -> None:
                if not isinstance(e, AudioReceived) or seen["opened"] is None:
                    return
                if name == "restart":
                    seen["first"] = seen["first"] or time.monotonic()
                elif seen["first"] is None:
                    seen["before"] += len(e.audio)

            return sink

        for i in range(turns):
            h = pool.open_turn(f"t{i}", turn, sink_for(f"t{i}"))
            h.send_text(TALK_TEXT)
            h.end()
        await asyncio.sleep(wait_s)
        paused = any(c.paused for c in pool.connections)
        seen["opened"] = time.monotonic()
        h = pool.open_turn("restart", turn, sink_for("restart"))
        h.send_text("hello there")
        h.end()
        while seen["first"] is None:
            await asyncio.sleep(0.005)
        wait_ms = (seen["first"] - seen["opened"]) * 1000
        await pool.close()
        await server.close()
        before_s = seen["before"] / bytes_per_s
        return (
            f"flow_high_s={flow_high_s} paused at the open: {paused}; before its first audio:"
            f" {before_s:.1f} s of the others' audio ({seen['before'] / 1e6:.2f} MB),"
            f" {wait_ms:.0f} ms"
        )

    async def all_runs() -> None:
        for _ in range(reps):
            for flow in (None, FLOW_HIGH_S):
                print(await one(flow), flush=True)

    asyncio.run(all_runs())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=400)
    ap.add_argument("--seconds", type=float, default=25.0)
    ap.add_argument("--src", default=os.environ.get("BENCH_SOURCE_TREE", ""))
    ap.add_argument("--pcm24k", action="store_true", help="the provider sends 24 kHz PCM")
    ap.add_argument("--keep", default="", help="keep the raw records in this directory")
    ap.add_argument("--analyze", default="", help="only analyse the records kept in this directory")
    ap.add_argument("--json", default="", help="write the report (with every episode) here")
    ap.add_argument(
        "--restart-demo",
        type=int,
        default=0,
        metavar="TURNS",
        help="only show what a restarted turn waits behind on a connection of TURNS turns",
    )
    args = ap.parse_args()
    if args.restart_demo:
        restart_demo(args.restart_demo)
        return
    if args.analyze:
        result = report(_load(Path(args.analyze)))
    else:
        pin_self()
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(args.keep) if args.keep else Path(tmp)
            out.mkdir(parents=True, exist_ok=True)
            run(args, out)
            result = report(_load(out))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
