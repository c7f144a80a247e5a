"""Session-wide: the suite runs on the code as built (compiled or pure Python), never stale."""

from __future__ import annotations

import gc
import os
import re
import shutil
import socket
import subprocess
from collections.abc import Callable, Iterator
from functools import cache
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from bridge import native
from bridge.io.gcpolicy import collect_named

# Property tests: the same examples on every run, for CI and developers alike
# (each test's own ``max_examples`` is kept). No deadline and no timing health
# check: a loaded 2-core machine must not turn a slow example into a failure.
# ``CALLBRIDGE_HYPOTHESIS=explore`` draws new examples each run (local use).
_TIMING_FREE = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("callbridge", _TIMING_FREE, derandomize=True, database=None)
settings.register_profile("explore", _TIMING_FREE, derandomize=False)
_PROFILE = os.environ.get("CALLBRIDGE_HYPOTHESIS", "callbridge")
if _PROFILE not in ("callbridge", "explore"):
    raise pytest.UsageError(
        f"CALLBRIDGE_HYPOTHESIS={_PROFILE!r}: expected 'callbridge' or 'explore'"
    )
settings.load_profile(_PROFILE)


def _time_factor() -> float:
    """``CALLBRIDGE_TEST_TIME_FACTOR``: how much longer than at home the shell tests wait."""
    raw = os.environ.get("CALLBRIDGE_TEST_TIME_FACTOR", "1")
    try:
        factor = float(raw)
    except ValueError:
        factor = 0.0
    if not factor >= 1.0:
        raise pytest.UsageError(f"CALLBRIDGE_TEST_TIME_FACTOR={raw!r}: expected a number >= 1")
    return factor


def pytest_report_header() -> list[str]:
    built = native.compiled()
    if not built:
        build = "callbridge: pure Python (no module compiled with mypyc)"
    else:
        build = f"callbridge: {len(built)} modules compiled with mypyc (bridge/native.py)"
    return [build, f"callbridge: CALLBRIDGE_TEST_TIME_FACTOR={_time_factor()}"]


# ----------------------------------------------------------- prerequisites
#
# One rule: a prerequisite `make test` installs is a failure when missing (the
# run would otherwise pass without testing what it claims); one it cannot
# install is a skip that says why. ``@pytest.mark.needs(...)`` names them.

MAKEFILE = Path(__file__).resolve().parents[1] / "Makefile"
EXTRA_BINS = {"text2pcap": "tshark", "dumpcap": "tshark"}
"""Binaries that come with a package in ``PEERS`` without being in ``PEER_BINS``."""


@cache
def peer_packages() -> dict[str, str]:
    """Binary -> Debian package, from the Makefile's ``PEER_BINS`` and ``PEERS`` (in step)."""
    text = MAKEFILE.read_text()
    lists = {
        m.group(1): m.group(2).split()
        for m in re.finditer(r"^(PEERS|PEER_BINS) := (.*)$", text, re.MULTILINE)
    }
    packages, bins = lists["PEERS"], lists["PEER_BINS"]
    assert len(packages) == len(bins), "Makefile: PEERS and PEER_BINS must name one per package"
    return {**dict(zip(bins, packages, strict=True)), **EXTRA_BINS}


@cache
def peer_files() -> dict[str, tuple[Path, str]]:
    """Need -> (file, Debian package), from the Makefile's ``PEER_FILES`` (``NEED=PATH``)
    and ``PEER_FILE_PACKAGES`` (in step): peers that are a file rather than a binary."""
    text = MAKEFILE.read_text()
    lists = {
        m.group(1): m.group(2).split()
        for m in re.finditer(r"^(PEER_FILES|PEER_FILE_PACKAGES) := (.*)$", text, re.MULTILINE)
    }
    files, packages = lists["PEER_FILES"], lists["PEER_FILE_PACKAGES"]
    assert len(files) == len(packages), "Makefile: PEER_FILES and PEER_FILE_PACKAGES in step"
    return {
        need: (Path(path), package)
        for (need, _, path), package in zip(
            (f.partition("=") for f in files), packages, strict=True
        )
    }


@cache
def apt_candidate(package: str) -> bool:
    """Whether apt here knows a version of ``package`` to install (`make test` could)."""
    if shutil.which("apt-cache") is None:
        return False
    try:
        out = subprocess.run(
            ["apt-cache", "policy", package], capture_output=True, text=True, timeout=30
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return False
    m = re.search(r"^\s*Candidate:\s*(\S+)", out, re.MULTILINE)
    return m is not None and m.group(1) != "(none)"


@cache
def has_ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_DGRAM) as s:
            s.bind(("::1", 0))
    except OSError:
        return False
    return True


def has_cap_sys_nice() -> bool:
    """CAP_SYS_NICE in the effective set (root in a container may lack it)."""
    status = Path("/proc/self/status").read_text()
    m = re.search(r"^CapEff:\s*([0-9a-f]+)$", status, re.MULTILINE)
    return m is not None and bool(int(m.group(1), 16) >> 23 & 1)


def _missing(need: str, why: str) -> tuple[str, str] | None:
    """("fail" | "skip", reason) when ``need`` is not met here, else None."""
    if need == "ipv6":
        return None if has_ipv6_loopback() else ("skip", "no IPv6 loopback (::1) on this machine")
    if need == "root":
        return None if os.geteuid() == 0 else ("skip", f"needs root: {why}")
    if need == "cap_sys_nice":
        if has_cap_sys_nice():
            return None
        return ("skip", f"needs CAP_SYS_NICE (root in a container may not have it): {why}")
    if need == "piper":
        from bridge.ttsd.piper_engine import piper_available

        if piper_available():
            return None
        return ("fail", "the Piper voice (the local-tts extra) is missing: `make test` installs it")
    if need in peer_files():
        path, package = peer_files()[need]
        if path.exists():
            return None
        if not apt_candidate(package):
            return (
                "skip",
                f"{path} is missing and apt here has no Debian package {package!r} to "
                "install it from (`make test` installs it where it can)",
            )
        return (
            "fail",
            f"{path} is missing (Debian package {package!r}): `make test` installs it as root",
        )
    package = peer_packages().get(need)
    if package is None:
        raise pytest.UsageError(f"@pytest.mark.needs({need!r}): not a peer in the Makefile")
    if shutil.which(need) is not None:
        return None
    return (
        "fail",
        f"{need} is missing (Debian package {package!r}): `make test` installs it as root; "
        "`make unit` runs the tests that need no peer",
    )


@pytest.hookimpl(tryfirst=True)  # before ``-m`` selects: `make unit` leaves these out
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    peers = peer_packages().keys() | peer_files().keys()
    for item in items:
        if any(n in peers for m in item.iter_markers("needs") for n in m.args):
            item.add_marker(pytest.mark.peers)


def pytest_runtest_setup(item: pytest.Item) -> None:
    for mark in item.iter_markers("needs"):
        for need in mark.args:
            missing = _missing(need, str(mark.kwargs.get("why", "")))
            if missing is None:
                continue
            outcome, reason = missing
            if outcome == "fail":
                pytest.fail(reason, pytrace=False)
            pytest.skip(reason)


def pytest_sessionstart(session: pytest.Session) -> None:
    old = native.stale()
    if old:
        pytest.exit(
            "compiled modules older than their source (rebuild: `make venv` or "
            "`pip install -e .`; or go back to pure Python: `python -m bridge.native --clean`): "
            + ", ".join(old),
            returncode=4,
        )


@pytest.fixture
def no_cyclic_gc() -> Iterator[None]:
    """The cyclic collector off for the test: what it would free is left for it to find."""
    was_enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.unfreeze()  # the daemon freezes what it has at start-up
        if was_enabled:
            gc.enable()
        gc.collect()


def _collect_garbage() -> list[str]:
    return sorted(collect_named())


@pytest.fixture
def cyclic_garbage() -> Callable[[], list[str]]:
    """A full collection's unreachable objects, by type (``module.qualname``), sorted.

    With ``no_cyclic_gc`` on, that is everything left in reference cycles since
    the last call: what reference counting alone could not free.
    """
    return _collect_garbage
