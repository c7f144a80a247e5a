#!/bin/sh
# Install callbridge from this source tree (what `make install` runs).
#
#   sudo scripts/install.sh
#
# What it installs:
#   $PREFIX/venv                     a virtualenv with callbridge[local-tts]
#   $UNITDIR/callbridge.service      the systemd units (ExecStart points into
#   $UNITDIR/callbridge@.service     $PREFIX/venv)
#   $SYSCONFDIR/sysusers.d/callbridge.conf, $SYSCONFDIR/tmpfiles.d/callbridge.conf
#   $SYSCONFDIR/callbridge/callbridge.toml   the default config, only if none exists
#   $SYSCONFDIR/callbridge/credentials/      (0700) with empty placeholders for the
#                                            unit's LoadCredential= files, only if missing
# Everything is put under $DESTDIR when it is set (a staging root, e.g. for a
# test); nothing outside it is touched then, and no package is installed.
#
# Environment:
#   DESTDIR              staging root (default: empty, the real system)
#   PREFIX               where the venv goes (default: /opt/callbridge)
#   SYSCONFDIR           (default: /etc)
#   UNITDIR              (default: $SYSCONFDIR/systemd/system)
#   PYTHON               interpreter for the venv (default: python3, >= 3.11)
#   CALLBRIDGE_EXTRAS    pip extras (default: local-tts; empty for none)
#   CALLBRIDGE_WHEELHOUSE  install offline from this directory of wheels
#                        (pip --no-index --find-links DIR) instead of building
#                        the source tree; make one with
#                        `pip wheel -w DIR '.[local-tts]'`
#   CALLBRIDGE_PIP_ARGS  extra pip arguments, e.g. "--no-deps" or a proxy/index
#
# On a clean Debian 12 the venv module comes from python3-venv: when it is
# missing and this runs as root (without DESTDIR), it is installed with apt-get.
set -eu

SRC=$(CDPATH= cd -- "$(dirname -- "$0")/.." && pwd)
DESTDIR=${DESTDIR:-}
PREFIX=${PREFIX:-/opt/callbridge}
SYSCONFDIR=${SYSCONFDIR:-/etc}
UNITDIR=${UNITDIR:-$SYSCONFDIR/systemd/system}
PYTHON=${PYTHON:-python3}
EXTRAS=${CALLBRIDGE_EXTRAS-local-tts}
WHEELHOUSE=${CALLBRIDGE_WHEELHOUSE:-}
PIP_ARGS=${CALLBRIDGE_PIP_ARGS:-}

say() { printf '%s\n' "install.sh: $*"; }
die() { printf '%s\n' "install.sh: error: $*" >&2; exit 1; }

[ -f "$SRC/pyproject.toml" ] && [ -d "$SRC/bridge" ] || die "run me from a callbridge source tree ($SRC)"
command -v "$PYTHON" >/dev/null 2>&1 || die "$PYTHON not found (Debian: apt-get install python3)"
"$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
    || die "$PYTHON is older than 3.11"

# python3 -m venv needs ensurepip, which Debian ships in python3-venv.
if ! "$PYTHON" -c 'import venv, ensurepip' >/dev/null 2>&1; then
    if [ -z "$DESTDIR" ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        say "installing python3-venv"
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q python3-venv >/dev/null \
            || { apt-get update -q >/dev/null && \
                 DEBIAN_FRONTEND=noninteractive apt-get install -y -q python3-venv >/dev/null; } \
            || die "apt-get install python3-venv failed"
    else
        die "the Python venv module is missing: apt-get install python3-venv (as root)"
    fi
fi

VENV=$DESTDIR$PREFIX/venv
ETC=$DESTDIR$SYSCONFDIR

# 1. the virtualenv and the package
if [ ! -x "$VENV/bin/python" ]; then
    say "creating $VENV"
    mkdir -p "$(dirname -- "$VENV")"
    "$PYTHON" -m venv "$VENV"
fi
spec=$SRC
[ -n "$WHEELHOUSE" ] && spec=callbridge
[ -n "$EXTRAS" ] && spec="$spec[$EXTRAS]"
if [ -n "$WHEELHOUSE" ]; then
    say "installing $spec from $WHEELHOUSE (offline)"
    # shellcheck disable=SC2086  # PIP_ARGS is a list of words on purpose
    "$VENV/bin/pip" install --quiet --disable-pip-version-check --upgrade \
        --no-index --find-links "$WHEELHOUSE" $PIP_ARGS "$spec"
else
    say "installing $spec"
    # shellcheck disable=SC2086
    "$VENV/bin/pip" install --quiet --disable-pip-version-check --upgrade $PIP_ARGS "$spec"
fi
"$VENV/bin/callbridge" --version >/dev/null || die "the installed callbridge does not run"

# 2. systemd units, pointed at this prefix
mkdir -p "$DESTDIR$UNITDIR"
for unit in callbridge.service callbridge@.service; do
    sed -e "s|/opt/callbridge/venv|$PREFIX/venv|g" \
        -e "s|/etc/callbridge|$SYSCONFDIR/callbridge|g" \
        "$SRC/systemd/$unit" > "$DESTDIR$UNITDIR/$unit.tmp"
    chmod 0644 "$DESTDIR$UNITDIR/$unit.tmp"
    mv "$DESTDIR$UNITDIR/$unit.tmp" "$DESTDIR$UNITDIR/$unit"
done
install -D -m 0644 "$SRC/systemd/callbridge.sysusers.conf" "$ETC/sysusers.d/callbridge.conf"
install -D -m 0644 "$SRC/systemd/callbridge.tmpfiles.conf" "$ETC/tmpfiles.d/callbridge.conf"

# 3. configuration and credentials: never overwrite what is there
install -d -m 0755 "$ETC/callbridge"
install -d -m 0700 "$ETC/callbridge/credentials"
if [ -e "$ETC/callbridge/callbridge.toml" ]; then
    say "keeping the existing $SYSCONFDIR/callbridge/callbridge.toml"
else
    sed -e 's|^cache_dir = .*|cache_dir = "/var/cache/callbridge"|' \
        "$SRC/config/callbridge.toml" > "$ETC/callbridge/callbridge.toml"
    chmod 0644 "$ETC/callbridge/callbridge.toml"
    say "installed the default config $SYSCONFDIR/callbridge/callbridge.toml"
fi
for cred in $(sed -n 's|^LoadCredential=[^:]*:/etc/callbridge/credentials/||p' \
        "$SRC/systemd/callbridge.service"); do
    if [ ! -e "$ETC/callbridge/credentials/$cred" ]; then
        (umask 077 && : > "$ETC/callbridge/credentials/$cred")
    fi
done
"$VENV/bin/callbridge" check-config "$ETC/callbridge/callbridge.toml" >/dev/null \
    || say "warning: $SYSCONFDIR/callbridge/callbridge.toml does not validate (callbridge check-config)"

version=$("$VENV/bin/callbridge" --version)
cat <<NEXT

$version installed into $DESTDIR$PREFIX/venv

Next steps:
  1. Edit $SYSCONFDIR/callbridge/callbridge.toml (every key: config/README.md) and
     check it:  $PREFIX/venv/bin/callbridge check-config $SYSCONFDIR/callbridge/callbridge.toml
  2. Put secrets in $SYSCONFDIR/callbridge/credentials/ (mode 0600; the unit loads
     them with LoadCredential=, see docs/deployment.md).
  3. systemctl daemon-reload
  4. systemctl enable --now callbridge
     (or one instance per core: systemctl enable --now callbridge@a, with
      $SYSCONFDIR/callbridge/a.toml)
  5. curl -s http://127.0.0.1:8081/readyz   and   journalctl -u callbridge -f
NEXT
