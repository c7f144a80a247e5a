"""scripts/install.sh into a staging root (DESTDIR), offline, from a wheel
built from a copy of this source tree."""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from bridge import __version__

ROOT = Path(__file__).resolve().parents[2]
TREE = [
    "pyproject.toml",
    "setup.py",
    "README.md",
    "bridge",
    "codecs",
    "config",
    "systemd",
    "scripts",
]


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A copy of the source tree and a wheelhouse with its wheel."""
    base = tmp_path_factory.mktemp("install")
    src = base / "src"
    src.mkdir()
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info", "build", "*.so")
    for name in TREE:
        p = ROOT / name
        if p.is_dir():
            shutil.copytree(p, src / name, ignore=ignore)
        else:
            shutil.copy(p, src / name)
    wheels = base / "wheels"
    # pure Python: what is tested is install.sh, and the mypyc build (the venv's own
    # install compiles it) takes minutes, past the test's timeout on a loaded machine
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(wheels), str(src)],
        check=True,
        capture_output=True,
        env={**os.environ, "CALLBRIDGE_PURE_PYTHON": "1"},
    )
    return src, wheels


def _install(src: Path, wheels: Path, dest: Path, **env: str) -> subprocess.CompletedProcess[str]:
    run_env = {
        **os.environ,
        "DESTDIR": str(dest),
        "PYTHON": sys.executable,
        "CALLBRIDGE_WHEELHOUSE": str(wheels),
        "CALLBRIDGE_PIP_ARGS": "--no-deps",
        **env,
    }
    out = subprocess.run(
        ["sh", str(src / "scripts" / "install.sh")],
        env=run_env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    return out


def _mode(p: Path) -> int:
    return stat.S_IMODE(p.stat().st_mode)


def test_install_into_destdir(source: tuple[Path, Path], tmp_path: Path) -> None:
    src, wheels = source
    dest = tmp_path / "root"
    real_prefix_existed = Path("/opt/callbridge").exists()
    out = _install(src, wheels, dest)

    exe = dest / "opt/callbridge/venv/bin/callbridge"
    version = subprocess.run([str(exe), "--version"], capture_output=True, text=True, check=True)
    assert version.stdout.strip() == f"callbridge {__version__}"

    units = dest / "etc/systemd/system"
    for unit in ["callbridge.service", "callbridge@.service"]:
        text = (units / unit).read_text()
        assert "ExecStart=/opt/callbridge/venv/bin/callbridge serve --config" in text
        assert text == (ROOT / "systemd" / unit).read_text(), "default prefix: unit unchanged"
        assert _mode(units / unit) == 0o644
    assert (dest / "etc/sysusers.d/callbridge.conf").read_text() == (
        ROOT / "systemd/callbridge.sysusers.conf"
    ).read_text()
    assert (dest / "etc/tmpfiles.d/callbridge.conf").read_text() == (
        ROOT / "systemd/callbridge.tmpfiles.conf"
    ).read_text()

    config = dest / "etc/callbridge/callbridge.toml"
    shipped = (ROOT / "config/callbridge.toml").read_text()
    cache = 'cache_dir = "/var/cache/callbridge"'  # the unit's CacheDirectory
    assert config.read_text() == re.sub(r"(?m)^cache_dir = .*$", cache, shipped)
    assert cache in config.read_text()
    # the wheelhouse holds callbridge alone (--no-deps, offline): reading a config builds
    # the engines' settings, so the dependencies come from this test's own venv
    deps = os.pathsep.join(p for p in sys.path if p.endswith("site-packages"))
    check = subprocess.run(
        [str(exe), "check-config", str(config)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": deps},
    )
    assert check.returncode == 0, check.stderr

    creds = dest / "etc/callbridge/credentials"
    assert _mode(creds) == 0o700
    names = sorted(p.name for p in creds.iterdir())
    assert names == ["api-token", "provider-keys", "twilio-auth-token"]
    assert all(_mode(creds / n) == 0o600 for n in names)

    assert "systemctl daemon-reload" in out.stdout
    assert "systemctl enable --now callbridge" in out.stdout
    assert Path("/opt/callbridge").exists() == real_prefix_existed, "nothing outside DESTDIR"

    # A second run upgrades in place and keeps the operator's config and secrets.
    config.write_text(config.read_text() + "\n# edited by the operator\n")
    (creds / "api-token").write_text("secret")
    again = _install(src, wheels, dest)
    assert "keeping the existing /etc/callbridge/callbridge.toml" in again.stdout
    assert config.read_text().endswith("# edited by the operator\n")
    assert (creds / "api-token").read_text() == "secret"


def test_prefix_is_written_into_the_units(source: tuple[Path, Path], tmp_path: Path) -> None:
    src, wheels = source
    dest = tmp_path / "root"
    _install(src, wheels, dest, PREFIX="/srv/cb", CALLBRIDGE_EXTRAS="")
    exe = dest / "srv/cb/venv/bin/callbridge"
    assert subprocess.run([str(exe), "--version"], capture_output=True).returncode == 0
    text = (dest / "etc/systemd/system/callbridge.service").read_text()
    assert "ExecStart=/srv/cb/venv/bin/callbridge serve" in text
    assert "/opt/callbridge/venv" not in text
    assert not (dest / "opt").exists()


def test_refuses_to_run_outside_a_source_tree(tmp_path: Path) -> None:
    lone = tmp_path / "scripts"
    lone.mkdir()
    shutil.copy(ROOT / "scripts/install.sh", lone / "install.sh")
    out = subprocess.run(
        ["sh", str(lone / "install.sh")],
        env={**os.environ, "DESTDIR": str(tmp_path / "root")},
        capture_output=True,
        text=True,
    )
    assert out.returncode == 1
    assert "run me from a callbridge source tree" in out.stderr
    assert not (tmp_path / "root").exists()
