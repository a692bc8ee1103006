# Sourced by start.sh, tests/run.sh and bench/run.sh (POSIX sh).
# Makes sure a virtualenv exists in .venv with this project installed, and
# (when NEED_MARIADB=1) that mariadbd is installed. Idempotent and quick when
# nothing changed.

ROOT=${ROOT:-$(pwd)}
VENV="$ROOT/.venv"
PY=${PYTHON:-python3}

as_root() {
    if [ "$(id -u)" = "0" ]; then "$@"
    elif command -v sudo >/dev/null 2>&1; then sudo "$@"
    else echo "need root to run: $*" >&2; return 1
    fi
}

apt_install() {
    if ! command -v apt-get >/dev/null 2>&1; then
        echo "apt-get not found; please install: $*" >&2
        return 1
    fi
    if [ ! -f /tmp/.capturer-apt-updated ]; then
        as_root apt-get update -qq && touch /tmp/.capturer-apt-updated
    fi
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

if ! command -v "$PY" >/dev/null 2>&1; then
    apt_install python3 python3-venv python3-pip || exit 1
fi

if [ ! -x "$VENV/bin/python" ]; then
    echo "bootstrap: creating virtualenv in $VENV" >&2
    if ! "$PY" -m venv "$VENV" 2>/dev/null; then
        rm -rf "$VENV"
        apt_install python3-venv || exit 1
        "$PY" -m venv "$VENV" || exit 1
    fi
    "$VENV/bin/python" -m pip install -q --upgrade pip >/dev/null 2>&1 || true
fi

# reinstall when the declared dependencies or the extras asked for change
EXTRAS=${EXTRAS:-}
STAMP="$VENV/.capturer-installed"
WANT="$(cat "$ROOT/setup.py" 2>/dev/null | cksum | cut -d' ' -f1)-$EXTRAS"
if [ "$(cat "$STAMP" 2>/dev/null)" != "$WANT" ]; then
    echo "bootstrap: installing the project into $VENV${EXTRAS:+ with [$EXTRAS]}" >&2
    spec="$ROOT"
    [ -n "$EXTRAS" ] && spec="$ROOT[$EXTRAS]"
    "$VENV/bin/python" -m pip install -q -e "$spec" || exit 1
    echo "$WANT" > "$STAMP"
fi

if [ "${NEED_MARIADB:-0}" = "1" ]; then
    if ! command -v mariadbd >/dev/null 2>&1 && [ ! -x /usr/sbin/mariadbd ]; then
        echo "bootstrap: installing mariadb-server (mariadbd not found)" >&2
        apt_install mariadb-server || exit 1
    fi
fi
