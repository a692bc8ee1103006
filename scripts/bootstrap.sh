# Sourced by start.sh, tests/run.sh and bench/run.sh (POSIX sh).
# Makes sure a virtualenv exists in .venv with this project installed, and
# (when NEED_MARIADB=1) that mariadbd is installed, (when NEED_POSTGRES=1) PostgreSQL, (when NEED_CHROMIUM=1)
# Chromium, (when NEED_IPROUTE=1, as root) iproute2, (when NEED_KAFKA=1) a Java runtime, Maven and the jars of
# the private Apache Kafka broker (devtools/local_kafka.py, resolved once from Maven Central into a cache). Idempotent and quick when
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

# lint only (tests/run.sh's first step): ruff in the virtualenv, nothing else
if [ "${BOOTSTRAP_LINT_ONLY:-0}" = "1" ]; then
    if [ ! -x "$VENV/bin/ruff" ]; then
        "$VENV/bin/python" -m pip install -q "ruff==0.17.6" || return 1  # the version setup.py pins (test extra)
    fi
    return 0
fi

# the C parts (capturer/_native/*.c: row decoders, JSON, SQL escaping, wire format) need a C
# compiler and Python's headers; without them the install still works, slower
if ! command -v cc >/dev/null 2>&1 && ! command -v gcc >/dev/null 2>&1; then
    echo "bootstrap: installing a C compiler for capturer/_native/*.c" >&2
    apt_install gcc python3-dev || echo "bootstrap: no C compiler; using the pure-Python decoder" >&2
fi

# (re)install when setup.py or the C source changed; each extra (test, spark, confluent) once on top
EXTRAS=${EXTRAS:-}
SUM="$(cat "$ROOT/setup.py" "$ROOT"/capturer/_native/*.[ch] | cksum | cut -d' ' -f1)"
STAMP="$VENV/.capturer-installed"
if [ "$(cat "$STAMP" 2>/dev/null)" != "$SUM" ]; then
    echo "bootstrap: installing the project into $VENV" >&2
    "$VENV/bin/python" -m pip install -q -e "$ROOT" || exit 1
    # generated protobuf code is made here, by the build, never committed
    "$VENV/bin/python" -m capturer.model.protogen >/dev/null || exit 1
    rm -f "$VENV"/.capturer-extra-*
    echo "$SUM" > "$STAMP"
fi
# MariaDB Connector/Python (extra "snapshot": fast snapshot reads) builds against libmariadb
if ! command -v mariadb_config >/dev/null 2>&1 && ! command -v mysql_config >/dev/null 2>&1; then
    echo "bootstrap: installing libmariadb-dev (MariaDB Connector/Python for snapshots)" >&2
    apt_install libmariadb-dev pkg-config || echo "bootstrap: no libmariadb-dev; snapshots use pymysql" >&2
fi
for extra in snapshot $(echo "$EXTRAS" | tr ',' ' '); do
    if [ "$(cat "$VENV/.capturer-extra-$extra" 2>/dev/null)" != "$SUM" ]; then
        echo "bootstrap: installing [$extra] (pyspark is a ~450 MB download the first time)" >&2
        if ! "$VENV/bin/python" -m pip install -q -e "$ROOT[$extra]"; then
            if [ "$extra" = "snapshot" ]; then
                echo "bootstrap: MariaDB Connector/Python did not install; snapshots use pymysql (slower)" >&2
                continue
            fi
            exit 1
        fi
        echo "$SUM" > "$VENV/.capturer-extra-$extra"
    fi
done

case ",$EXTRAS," in
    *,spark,*)
        if ! command -v java >/dev/null 2>&1; then
            echo "bootstrap: installing a Java runtime for Spark (java not found)" >&2
            apt_install openjdk-17-jre-headless || exit 1
        fi ;;
esac

# the private Apache Kafka broker of the tests, the full demo and the bench (devtools/local_kafka.py):
# java runs it, mvn resolves its jars from Maven Central once (cached; later starts resolve nothing)
if [ "${NEED_KAFKA:-0}" = "1" ]; then
    if ! command -v java >/dev/null 2>&1; then
        echo "bootstrap: installing a Java runtime for Apache Kafka (java not found)" >&2
        apt_install openjdk-17-jre-headless || exit 1
    fi
    if ! command -v mvn >/dev/null 2>&1; then
        echo "bootstrap: installing maven (resolves Apache Kafka's jars)" >&2
        apt_install maven || exit 1
    fi
    "$VENV/bin/python" -m devtools.local_kafka --fetch >/dev/null || exit 1
fi

# PostgreSQL regions' tests and benchmarks start private servers (initdb + postgres with wal_level=logical)
if [ "${NEED_POSTGRES:-0}" = "1" ]; then
    if ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 && ! command -v initdb >/dev/null 2>&1; then
        echo "bootstrap: installing postgresql (initdb not found)" >&2
        apt_install postgresql || exit 1
    fi
    # as root, the private servers run as the postgres user (the package creates it)
    if [ "$(id -u)" = "0" ] && ! id postgres >/dev/null 2>&1; then
        as_root useradd --system --home-dir /var/lib/postgresql --shell /bin/sh postgres || exit 1
    fi
fi

# the status page's test opens it in headless Chromium (Debian's chromium package)
if [ "${NEED_CHROMIUM:-0}" = "1" ]; then
    if ! command -v chromium >/dev/null 2>&1 && ! command -v chromium-browser >/dev/null 2>&1; then
        echo "bootstrap: installing chromium (headless browser for the status page test)" >&2
        apt_install chromium || exit 1
    fi
fi

if [ "${NEED_MARIADB:-0}" = "1" ]; then
    if ! command -v mariadbd >/dev/null 2>&1 && [ ! -x /usr/sbin/mariadbd ]; then
        echo "bootstrap: installing mariadb-server (mariadbd not found)" >&2
        apt_install mariadb-server || exit 1
    fi
fi

# high availability's tests start private etcd servers (Debian's etcd-server)
if [ "${NEED_ETCD:-0}" = "1" ]; then
    if ! command -v etcd >/dev/null 2>&1 && [ ! -x /usr/bin/etcd ]; then
        echo "bootstrap: installing etcd-server (etcd not found)" >&2
        apt_install etcd-server || exit 1
    fi
fi

# the test of an agent in a network namespace of its own uses ip (iproute2); as root only
if [ "${NEED_IPROUTE:-0}" = "1" ] && [ "$(id -u)" = "0" ] && ! command -v ip >/dev/null 2>&1 \
        && [ ! -x /usr/sbin/ip ] && [ ! -x /sbin/ip ]; then
    echo "bootstrap: installing iproute2 (network namespaces for the agent test)" >&2
    apt_install iproute2 || exit 1
fi
