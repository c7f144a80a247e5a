"""Which modules are compiled with mypyc, and whether the compiled ones are current.

The per-frame path of every call (the engines the media ticker drives 50
times a second per call) is compiled to C extension modules by mypyc when the
package is built (``setup.py``; docs/native.md). Python imports an extension
module in preference to the ``.py`` file beside it, so in a source tree
(``pip install -e .``, ``make``) an edit to one of these files does nothing
until the next build: ``stale()`` names them, the daemon logs them at start
and the test suite refuses to run on them. A build records what it compiled
(``MANIFEST``: each source's SHA-256 when mypyc read it), so a source edited
while a build runs is stale too, though its extension module ends up newer
than it. This module itself stays pure Python (``setup.py`` reads the list
below from it).
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import json
from pathlib import Path

__all__ = [
    "NATIVE_MODULES",
    "NATIVE_PACKAGES",
    "clean",
    "compiled",
    "main",
    "native_sources",
    "stale",
    "write_manifest",
]

NATIVE_PACKAGES = ("bridge/media", "bridge/rtp", "bridge/streams", "codecs/telcodec")
"""Every module of these packages is compiled (their ``__init__`` stays Python). The
codec library (``telcodec``, importable on its own) converts every provider chunk and
caller frame; compiled, 500 ms of 24 kHz PCM to mu-law frames costs about 10 % less."""

NATIVE_MODULES = (
    "bridge/engine.py",
    "bridge/commands.py",
    "bridge/providers/base.py",
    "bridge/providers/client_common.py",
    "bridge/providers/kova/client.py",
    "bridge/io/ticker.py",
    "bridge/io/rtpsock.py",
    "bridge/io/callrun.py",
    "bridge/io/legs/sip_call.py",
    "bridge/io/legs/stream_call.py",
    "bridge/io/httpws.py",
)
"""And these: the base classes and types the compiled engines are built on, and the
per-frame part of the I/O shell (the media ticker, the RTP socket's per-packet calls, the
call runner, a SIP call's RTP, a media-stream call's carrier messages and WebSocket)."""

ROOT = Path(__file__).resolve().parent.parent
"""The directory that holds the ``bridge`` package."""

MANIFEST = "build/native_sources.json"
"""Where a build in a source tree records the SHA-256 of each source it compiled."""


def native_sources(root: Path = ROOT) -> list[str]:
    """The ``.py`` files mypyc compiles, relative to ``root``."""
    found = [
        path.relative_to(root).as_posix()
        for package in NATIVE_PACKAGES
        for path in sorted((root / package).glob("*.py"))
        if path.name != "__init__.py"
    ]
    return [*NATIVE_MODULES, *found]


def _extension(source: Path) -> Path | None:
    """The extension module built from ``source`` and lying beside it, if any."""
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        candidate = source.with_name(source.stem + suffix)
        if candidate.exists():
            return candidate
    return None


def compiled(root: Path = ROOT) -> list[str]:
    """The native sources that have an extension module beside them."""
    return [s for s in native_sources(root) if _extension(root / s) is not None]


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def write_manifest(root: Path = ROOT) -> None:
    """Record each source's SHA-256 as the build reads it (``setup.py``, before compiling)."""
    path = root / MANIFEST
    path.parent.mkdir(parents=True, exist_ok=True)
    digests = {s: _digest(root / s) for s in native_sources(root)}
    path.write_text(json.dumps(digests, indent=1, sort_keys=True) + "\n")


def _manifest(root: Path) -> dict[str, str] | None:
    try:
        data = json.loads((root / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def stale(root: Path = ROOT) -> list[str]:
    """Sources whose extension module is missing, older than the source, or built from
    other content than the source has now (the build's ``MANIFEST``, where there is one).

    Empty when nothing is compiled (a pure-Python install: nothing shadows
    the sources) or when every compiled module was built from its source as it is.
    """
    sources = native_sources(root)
    built = {s: _extension(root / s) for s in sources}
    if not any(built.values()):
        return []
    manifest = _manifest(root)
    return [
        s
        for s, ext in built.items()
        if ext is None
        or ext.stat().st_mtime < (root / s).stat().st_mtime
        or (manifest is not None and manifest.get(s) != _digest(root / s))
    ]


def clean(root: Path = ROOT) -> list[str]:
    """Remove the extension modules built beside the native sources (back to pure Python)."""
    removed = []
    for source in native_sources(root):
        ext = _extension(root / source)
        while ext is not None:
            ext.unlink()
            removed.append(ext.relative_to(root).as_posix())
            ext = _extension(root / source)
    for shared in root.glob("callbridge_native__mypyc.*"):
        if shared.suffix in (".so", ".pyd"):
            shared.unlink()
            removed.append(shared.name)
    return removed


def main(argv: list[str] | None = None) -> int:
    """``python -m bridge.native [--check | --clean]``: the build's state (used by the Makefile)."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m bridge.native", description=main.__doc__)
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--check", action="store_true", help="exit 1 if a compiled module is stale")
    group.add_argument("--clean", action="store_true", help="remove the compiled modules")
    args = parser.parse_args(argv)
    if args.clean:
        for name in clean():
            print(f"removed {name}")
        return 0
    built, old = compiled(), stale()
    if old:
        print(f"stale or missing compiled modules (rebuild: pip install -e .): {', '.join(old)}")
        return 1
    if not built:
        print("pure Python: no compiled modules")
        return 1 if args.check else 0
    print(f"{len(built)} modules compiled with mypyc, all current")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
