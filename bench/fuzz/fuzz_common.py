"""Shared runner of the coverage-guided fuzz targets in ``bench/fuzz/`` (atheris).

Each ``fuzz_<parser>.py`` defines ``test_one_input(data: bytes) -> None``
(raises on a finding: an exception escaping an engine, or state left behind)
and ``seeds() -> list[bytes]`` (built from the test fixtures), and calls
:func:`main` when run as a script::

    python -m bench.fuzz.fuzz_sip -atheris_runs=100000
    python -m bench.fuzz.fuzz_sip -max_total_time=60

Any libFuzzer flag works. Without a corpus directory on the command line the
seeds are written to a fresh temporary directory, which libFuzzer then grows;
crash inputs go to ``bench/results/fuzz/`` (``crash-<sha1>``), unless
``-artifact_prefix=`` says otherwise. ``make fuzz`` runs every target for a
bounded number of runs. ``tests/bench/test_fuzz_targets.py`` replays every
seed and every crash kept as a regression through the same ``test_one_input``,
without atheris.

atheris is in the ``bench`` extra (it compiles against the interpreter).
"""

from __future__ import annotations

import hashlib
import logging
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests"
ARTIFACTS = ROOT / "bench" / "results" / "fuzz"


def main(name: str, test_one_input: Callable[[bytes], None], seeds: list[bytes]) -> None:
    """Fuzz ``test_one_input`` under atheris with ``sys.argv``'s libFuzzer flags."""
    try:
        import atheris  # type: ignore[import-untyped, import-not-found, unused-ignore]
    except ImportError:
        sys.exit("atheris is not installed: pip install -e '.[bench]' (see bench/fuzz/)")
    args = list(sys.argv)
    if not any(not a.startswith("-") for a in args[1:]):
        corpus = Path(tempfile.mkdtemp(prefix=f"callbridge-fuzz-{name}-"))
        for seed in seeds:
            (corpus / hashlib.sha1(seed).hexdigest()).write_bytes(seed)
        args.append(str(corpus))
    if not any(a.startswith("-artifact_prefix=") for a in args):
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        args.append(f"-artifact_prefix={ARTIFACTS}/{name}-")
    # the engines' log lines are formatted (a formatter that raises is a finding) but not shown
    logging.basicConfig(handlers=[_DISCARD], level=logging.DEBUG, force=True)
    atheris.instrument_all()
    atheris.Setup(args, test_one_input)
    atheris.Fuzz()


class _Discard(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        self.format(record)


_DISCARD = _Discard()


def frames_of(data: bytes, limit: int = 16) -> list[str | bytes]:
    """``data`` as WebSocket frames, one a line (at most ``limit``): a line that
    starts with NUL is a binary frame of the rest, any other a text frame (UTF-8
    with replacement: a text frame holds valid UTF-8 only)."""
    return [
        line[1:] if line[:1] == b"\x00" else line.decode("utf-8", "replace")
        for line in data.split(b"\n")[:limit]
    ]


def frames_to_input(frames: list[str | bytes]) -> bytes:
    """The input :func:`frames_of` reads back as ``frames`` (for seeds; no newlines)."""
    return b"\n".join(
        b"\x00" + f if isinstance(f, bytes) else f.encode("utf-8", "replace") for f in frames
    )
