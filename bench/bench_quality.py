"""Audio quality of the outbound path: provider audio -> what the caller hears (issue 8, item 6).

Pipelines compared in the same run, on the same provider audio fed in the same
(realistic, irregular) chunks:

* **ours**: ``telcodec.transcode.ToTelephony(pcm_s16le @ rate -> mulaw)`` at
  the call's default soxr quality (HQ), decoded back to linear; **ours,
  released**: the same with ``release()`` after every chunk (what a call does
  when a turn would run dry with audio inside the resampler), the worst case;
  **ours, drained**: ``StreamResampler.release(least)`` after every chunk asking
  for all it holds, so nothing is kept back for an exact join (a call does this
  when the provider is less than a frame and the 12 ms tail ahead), the worst
  case of the shortened tail;
* **baseline**: what many bridges do, ``audioop.ratecv`` (state carried
  between chunks) + ``audioop.lin2ulaw``, decoded;
* **baseline, stateless**: the same with ``ratecv`` state dropped at every
  chunk (a common bug), for the chunk-join figure;
* **G.711 ceiling**: the reference itself through mu-law and back.

The reference is the provider audio resampled to 8 kHz offline in one go with
soxr VHQ and no G.711. Provider audio is Piper (``joe``, native 22.05 kHz) and
espeak-ng speech, resampled with soxr VHQ to 16, 22.05, 24, 44.1 and 48 kHz.

Figures:

* PESQ narrowband (ITU-T P.862, the ``pesq`` package) against the reference;
  also SNR, segmental SNR and log-spectral distance after alignment.
* Alias products of a stepped tone sweep, 0.3-12 kHz at 24 kHz in, -6 dBFS:
  the level of everything in the 8 kHz output that is not the swept tone, in
  dB relative to the input tone, on the linear 8 kHz output (the resampler
  alone) and, for the decoded G.711, the strongest spectral line other than
  the tone (G.711's own quantisation noise is broadband and sits near -40 dB).
* Chunk joins: the largest difference between the chunked output and the same
  pipeline fed the whole signal at once (in LSB of s16), and the largest
  sample-to-sample step of each.

    python -m bench.bench_quality [--quick]
"""

from __future__ import annotations

import argparse
import math
import statistics
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import soxr

from bench.bench_bargein import BOT_TEXT, TEXTS, Voices, _cached, _read_wav, _write_wav
from bench.common import write
from telcodec import g711
from telcodec.resample import StreamResampler
from telcodec.transcode import ToTelephony

HERE = Path(__file__).resolve().parent

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    import audioop

Signal = npt.NDArray[np.float64]
OUT_HZ = 8000
RATES_HZ = (16000, 22050, 24000, 44100, 48000)
GOAL_PESQ = 4.2
GOAL_ALIAS_DB = -50.0
Pipeline = Callable[[list[bytes], int], bytes]
"""(chunks of s16le at the rate, rate) -> s16le at 8 kHz (decoded if G.711)."""


# ------------------------------------------------------------------ pipelines


def ours(out_encoding: str, release: bool = False) -> Pipeline:
    """``release``: ``ToTelephony.release()`` after every chunk, as a call whose
    provider is never ahead (every chunk comes as the last one runs dry) does."""

    def run(chunks: list[bytes], rate_hz: int) -> bytes:
        tx = ToTelephony("pcm_s16le", rate_hz, out_encoding)  # type: ignore[arg-type]
        frames: list[bytes] = []
        for c in chunks:
            frames += tx.push(c)
            if release:
                frames += tx.release()
        data = b"".join(frames + tx.flush())
        return g711.ulaw_decode(data) if out_encoding == "mulaw" else data

    return run


def drained(out_encoding: str) -> Pipeline:
    """``StreamResampler.release(least)`` after every chunk with ``least`` all it holds:
    nothing kept back for an exact join (a call whose provider is exactly one frame
    ahead at every chunk gets this), the worst case of the shortened tail."""

    def run(chunks: list[bytes], rate_hz: int) -> bytes:
        rs = StreamResampler(rate_hz, OUT_HZ)
        grid = math.gcd(rate_hz, OUT_HZ)
        out: list[bytes] = []
        fed = got = 0
        for c in chunks:
            fed += len(c)
            out.append(rs.process(c))
            got += len(out[-1]) // 2
            held = fed // 2 * (OUT_HZ // grid) // (rate_hz // grid) - got
            if held > 0:
                out.append(rs.release(held))
                got += len(out[-1]) // 2
        data = b"".join(out) + rs.flush()
        if out_encoding == "mulaw":
            return g711.ulaw_decode(g711.ulaw_encode(data))
        return data

    return run


def ratecv_baseline(keep_state: bool, encode: bool = True) -> Pipeline:
    def run(chunks: list[bytes], rate_hz: int) -> bytes:
        state: Any = None
        out = bytearray()
        dangling = b""
        for c in chunks:
            c = dangling + c
            c, dangling = c[: len(c) & ~1], c[len(c) & ~1 :]
            # The naive baseline many bridges use, measured here on purpose.
            pcm, new_state = audioop.ratecv(c, 2, 1, rate_hz, OUT_HZ, state)  # noqa: TID251
            state = new_state if keep_state else None
            out += audioop.lin2ulaw(pcm, 2) if encode else pcm
        return audioop.ulaw2lin(bytes(out), 2) if encode else bytes(out)

    return run


PIPELINES: dict[str, Pipeline] = {
    "ours_hq_mulaw": ours("mulaw"),
    "ours_hq_mulaw_released": ours("mulaw", release=True),
    "ours_hq_mulaw_drained": drained("mulaw"),
    "baseline_ratecv_lin2ulaw": ratecv_baseline(True),
    "baseline_ratecv_stateless": ratecv_baseline(False),
}


def g711_ceiling(chunks: list[bytes], rate_hz: int) -> bytes:
    """The ideal path: one-shot soxr VHQ to 8 kHz, then mu-law (sweep only)."""
    x = from_pcm(b"".join(chunks))
    ref = soxr.resample(x, rate_hz, OUT_HZ, quality="VHQ")
    return g711.ulaw_decode(g711.ulaw_encode(to_pcm(ref)))


LINEAR: dict[str, Pipeline] = {
    "ours_hq_linear": ours("pcm_s16le"),
    "ours_hq_linear_released": ours("pcm_s16le", release=True),
    "ours_hq_linear_drained": drained("pcm_s16le"),
    "baseline_ratecv_linear": ratecv_baseline(True, encode=False),
}


def chunked(pcm: bytes, rng: np.random.Generator) -> list[bytes]:
    """Irregular provider chunks: 10-250 ms worth of bytes, odd sizes (split samples) too."""
    out, i = [], 0
    while i < len(pcm):
        n = int(rng.integers(160, 12000))
        out.append(pcm[i : i + n])
        i += n
    return out


def to_pcm(x: Signal) -> bytes:
    return np.clip(np.round(x), -32768, 32767).astype("<i2").tobytes()


def from_pcm(data: bytes) -> Signal:
    return np.frombuffer(data, "<i2").astype(np.float64)


# ------------------------------------------------------------------- metrics


def align(ref: Signal, deg: Signal, max_lag: int = 400) -> tuple[Signal, Signal, int]:
    """Trim both to the overlap at the integer lag that maximises correlation."""
    n = min(len(ref), len(deg))
    spec = np.fft.rfft(deg[:n], 2 * n) * np.conj(np.fft.rfft(ref[:n], 2 * n))
    cc = np.fft.irfft(spec)
    lags = np.concatenate([cc[: max_lag + 1], cc[-max_lag:]])
    k = int(np.argmax(lags))
    lag = k if k <= max_lag else k - 2 * max_lag - 1
    if lag >= 0:
        r, d = ref[: n - lag], deg[lag:n]
    else:
        r, d = ref[-lag:n], deg[: n + lag]
    m = min(len(r), len(d))
    return r[:m], d[:m], lag


def snr_db(ref: Signal, deg: Signal) -> float:
    return float(10 * np.log10(np.sum(ref**2) / max(np.sum((ref - deg) ** 2), 1e-9)))


def seg_snr_db(ref: Signal, deg: Signal, frame: int = 160) -> float:
    """Mean of per-20 ms SNRs clamped to [-10, 35] dB, over frames with signal."""
    n = len(ref) // frame
    r = ref[: n * frame].reshape(n, frame)
    d = deg[: n * frame].reshape(n, frame)
    sig = np.sum(r**2, axis=1)
    err = np.maximum(np.sum((r - d) ** 2, axis=1), 1e-9)
    keep = 10 * np.log10(np.maximum(sig, 1e-9) / frame) > 10 * np.log10(32768.0**2) - 50
    return float(np.mean(np.clip(10 * np.log10(np.maximum(sig, 1e-9) / err), -10, 35)[keep]))


def lsd_db(ref: Signal, deg: Signal, frame: int = 256) -> float:
    """Log-spectral distance (RMS over frequency of the dB difference, mean over frames)."""
    n = len(ref) // frame
    win = np.hanning(frame)
    r = np.abs(np.fft.rfft(ref[: n * frame].reshape(n, frame) * win, axis=1)) ** 2
    d = np.abs(np.fft.rfft(deg[: n * frame].reshape(n, frame) * win, axis=1)) ** 2
    keep = 10 * np.log10(np.sum(r, axis=1) + 1e-9) > 10 * np.log10(np.max(np.sum(r, axis=1))) - 40
    diff = 10 * np.log10((r + 1e-3) / (d + 1e-3))
    return float(np.mean(np.sqrt(np.mean(diff**2, axis=1))[keep]))


def pesq_nb(ref: Signal, deg: Signal) -> float | None:
    try:
        from pesq import pesq  # type: ignore[import-untyped]
    except ImportError:
        return None
    return float(pesq(OUT_HZ, ref.astype(np.int16), deg.astype(np.int16), "nb"))


def speech_quality(
    items: dict[str, tuple[npt.NDArray[np.int16], int]], rates: tuple[int, ...], seed: int
) -> dict[str, Any]:
    """Per pipeline and provider rate: PESQ, SNR, segSNR, LSD (means over the speech items)."""
    rng = np.random.default_rng(seed)
    table: dict[str, dict[str, dict[str, float | None]]] = {}
    for rate in rates:
        scores: dict[str, dict[str, list[float]]] = {}
        for native, native_hz in items.values():
            provider = soxr.resample(native.astype(np.float64), native_hz, rate, quality="VHQ")
            ref = np.round(soxr.resample(provider, rate, OUT_HZ, quality="VHQ"))
            pcm = to_pcm(provider)
            chunks = chunked(pcm, rng)
            outs = {name: from_pcm(p(chunks, rate)) for name, p in PIPELINES.items()}
            outs["g711_ceiling"] = from_pcm(g711.ulaw_decode(g711.ulaw_encode(to_pcm(ref))))
            for name, deg in outs.items():
                r, d, lag = align(ref, deg)
                s = scores.setdefault(name, {})
                s.setdefault("pesq_nb", []).append(pesq_nb(r, d) or float("nan"))
                s.setdefault("snr_db", []).append(snr_db(r, d))
                s.setdefault("seg_snr_db", []).append(seg_snr_db(r, d))
                s.setdefault("lsd_db", []).append(lsd_db(r, d))
                s.setdefault("lag_samples", []).append(float(lag))
        table[str(rate)] = {
            name: {k: round(statistics.mean(v), 3) for k, v in s.items()}
            for name, s in scores.items()
        }
    return table


# ------------------------------------------------------------------ aliasing


def _bh_window(n: int) -> Signal:
    """4-term Blackman-Harris (sidelobes ~ -92 dB)."""
    k = np.arange(n) / (n - 1)
    a = (0.35875, 0.48829, 0.14128, 0.01168)
    return np.asarray(
        a[0]
        - a[1] * np.cos(2 * np.pi * k)
        + a[2] * np.cos(4 * np.pi * k)
        - a[3] * np.cos(6 * np.pi * k),
        dtype=np.float64,
    )


def tone_products(out: Signal, f_hz: float, in_power: float) -> tuple[float, float]:
    """(everything but the tone, strongest line but the tone), dB re the input tone's power."""
    seg = out[len(out) // 2 - 1000 : len(out) // 2 + 1000]
    win = _bh_window(len(seg))
    spec = np.abs(np.fft.rfft(seg * win)) ** 2 / np.sum(win**2) * 2 / len(seg)
    freqs = np.fft.rfftfreq(len(seg), 1 / OUT_HZ)
    tone = (
        np.abs(freqs - f_hz) <= 5 * OUT_HZ / len(seg)
        if f_hz < OUT_HZ / 2
        else np.zeros_like(freqs, bool)
    )
    rest = spec.copy()
    rest[tone] = 0
    rest[:3] = 0  # DC: a mu-law/rounding offset, not an alias product
    total = float(np.sum(rest))
    peak_bin = int(np.argmax(rest))
    lo, hi = max(0, peak_bin - 4), peak_bin + 5
    line = float(np.sum(rest[lo:hi]))
    return _db(total, in_power), _db(line, in_power)


def _db(power: float, ref_power: float) -> float:
    return round(float(10 * np.log10(max(power, 1e-20) / ref_power)), 2)


def alias_sweep(points: int) -> dict[str, Any]:
    in_hz = 24000
    freqs = np.geomspace(300, 12000, points)
    amp = 32767 * 10 ** (-6 / 20)
    in_power = amp**2 / 2
    pipes: dict[str, Pipeline] = {**LINEAR, **PIPELINES, "g711_ceiling": g711_ceiling}
    curves: dict[str, list[tuple[float, float, float]]] = {name: [] for name in pipes}
    for f in freqs:
        t = np.arange(in_hz // 2) / in_hz
        pcm = to_pcm(amp * np.sin(2 * np.pi * f * t))
        chunks = [pcm[i : i + 960] for i in range(0, len(pcm), 960)]  # 20 ms at 24 kHz
        for name, p in pipes.items():
            total, line = tone_products(from_pcm(p(chunks, in_hz)), float(f), in_power)
            curves[name].append((round(float(f), 1), total, line))
    worst = {
        name: {
            "worst_non_tone_db": max(c[1] for c in curve),
            "worst_line_db": max(c[2] for c in curve),
            "worst_at_hz": max(curve, key=lambda c: c[1])[0],
            "worst_line_at_hz": max(curve, key=lambda c: c[2])[0],
        }
        for name, curve in curves.items()
    }
    return {"worst": worst, "curves": curves, "input_dbfs": -6, "in_rate_hz": in_hz}


# --------------------------------------------------------------- chunk joins


def chunk_joins(native: npt.NDArray[np.int16], native_hz: int, seed: int) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    out: dict[str, Any] = {}
    for rate in RATES_HZ:
        pcm = to_pcm(soxr.resample(native.astype(np.float64), native_hz, rate, quality="VHQ"))
        chunks = chunked(pcm, rng)
        pipes: dict[str, Pipeline] = {**LINEAR, **PIPELINES}
        row = {}
        for name, p in pipes.items():
            whole = from_pcm(p([pcm], rate))
            parts = from_pcm(p(chunks, rate))
            n = min(len(whole), len(parts))
            row[name] = {
                "max_diff_vs_unchunked_lsb": float(np.max(np.abs(whole[:n] - parts[:n]))),
                "max_step_chunked": float(np.max(np.abs(np.diff(parts[:n])))),
                "max_step_unchunked": float(np.max(np.abs(np.diff(whole[:n])))),
            }
        out[str(rate)] = row
    return out


# ---------------------------------------------------------------------- main


def native_items(voices: Voices, quick: bool) -> dict[str, tuple[npt.NDArray[np.int16], int]]:
    """Speech at the engines' native rates (Piper 22.05 kHz, espeak-ng 22.05 kHz)."""
    items: dict[str, tuple[npt.NDArray[np.int16], int]] = {}
    path = _cached("piper-native|" + BOT_TEXT)
    if not path.exists():
        from bridge.ttsd.piper_engine import PiperEngine

        eng = PiperEngine()
        pcm = np.frombuffer(b"".join(c.pcm for c in eng.synthesize(BOT_TEXT, "joe")), "<i2")
        _write_wav(path, pcm, eng.native_rate_hz)
    items["piper"] = _read_wav(path)
    if not quick:
        import subprocess
        import tempfile

        path = _cached("espeak-native|" + " ".join(TEXTS))
        if not path.exists():
            with tempfile.TemporaryDirectory() as tmp:
                raw = Path(tmp) / "e.wav"
                subprocess.run(
                    ["espeak-ng", "-v", "en-us", "-w", str(raw), " ".join(TEXTS)], check=True
                )
                data, rate = _read_wav(raw)
            _write_wav(path, data, rate)
        items["espeak"] = _read_wav(path)
    return items


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    items = native_items(Voices(), args.quick)
    rates = (16000, 24000, 48000) if args.quick else RATES_HZ
    quality = speech_quality(items, rates, seed=3)
    print(
        f"{'rate':>6} {'pipeline':<28} {'PESQ':>6} {'SNR':>6} {'segSNR':>7} {'LSD':>6} {'lag':>4}"
    )
    for rate, rows in quality.items():
        for name, s in rows.items():
            print(
                f"{rate:>6} {name:<28} {s['pesq_nb']:>6} {s['snr_db']:>6.1f} "
                f"{s['seg_snr_db']:>7.1f} {s['lsd_db']:>6.2f} {s['lag_samples']:>4.0f}"
            )
    sweep = alias_sweep(24 if args.quick else 80)
    print("alias sweep 0.3-12 kHz at 24 kHz in (dB re input tone; worst over the sweep):")
    for name, w in sweep["worst"].items():
        print(
            f"  {name:<28} non-tone {w['worst_non_tone_db']:>7} dB (at {w['worst_at_hz']} Hz)"
            f"  strongest other line {w['worst_line_db']:>7} dB (at {w['worst_line_at_hz']} Hz)"
        )
    native, native_hz = items["piper"]
    joins = chunk_joins(native, native_hz, seed=4)
    print("chunk joins (max |chunked - unchunked| in LSB):")
    for rate, rows in joins.items():
        print(
            f"  {rate:>6} "
            + "  ".join(f"{n}={r['max_diff_vs_unchunked_lsb']:g}" for n, r in rows.items())
        )
    figures = {"speech": quality, "alias_sweep": sweep, "chunk_joins": joins}
    settings = {
        "quick": args.quick,
        "rates_hz": rates,
        "speech_items": {
            k: {"native_rate_hz": r, "seconds": round(len(a) / r, 2)} for k, (a, r) in items.items()
        },
        "ours_quality": "HQ (CallOptions.resample_quality default)",
        "reference": "soxr VHQ one-shot to 8 kHz, no G.711",
        "chunks": "random 160-12000 bytes (odd sizes split samples)",
        "goals": {"pesq_nb": GOAL_PESQ, "alias_db": GOAL_ALIAS_DB, "chunk_join_lsb": 0},
    }
    print("wrote", write("quality", figures, settings))


if __name__ == "__main__":
    main()
