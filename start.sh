#!/bin/sh
# Start the capturer.
#   sh start.sh                  background; pid in log/capturer.pid, log in log/capturer.log
#   sh start.sh --foreground     in the foreground (Ctrl-C stops it cleanly)
#   sh start.sh --demo [--once]  self-contained demo: two private MariaDB regions -> file (no set-up; quick)
#   sh start.sh --demo full [--once]  the same into all four senders: the file, a private MySQL target, Kafka
#                                (a private Apache Kafka broker) and the Spark lake, each checked row by row with --once;
#                                installs the delta, demo and spark extras the first time (pyspark: a ~450 MB download)
#                                and Java where missing; a part that still cannot run is skipped, saying why
#   sh start.sh --demo baikaldb  the same with BaikalDB binlog tables (the test double's meta and stores)
#   sh start.sh --demo postgresql  a MariaDB and a PostgreSQL region merged into one file
#   sh start.sh --demo ha        two capturers in an active/standby group (a private etcd): kill -9 and handover
#   sh start.sh --config PATH    another config (default conf/config.cfg)
#   sh start.sh --agent          a region agent instead (config conf/agent.cfg; log/agent.log, log/agent.pid)
#   sh start.sh --apply          an applier instead: the capturer's Kafka topics into MySQL, files, the lake
#                                (config conf/apply.cfg; log/apply.log, log/apply.pid; docs/apply.md)
set -u
ROOT=$(cd "$(dirname "$0")" && pwd)
cd "$ROOT" || exit 1

FOREGROUND=0; DEMO=0; DEMO_KIND=mariadb; ONCE=0; CONFIG=; AGENT=0; APPLY=0
while [ $# -gt 0 ]; do
    case "$1" in
        --foreground|-f) FOREGROUND=1 ;;
        --demo)
            DEMO=1
            case "${2:-}" in
                mariadb|baikaldb|postgresql|full|ha) DEMO_KIND=$2; shift ;;
            esac ;;
        --demo=*) DEMO=1; DEMO_KIND=${1#--demo=} ;;
        --once) ONCE=1 ;;
        --agent) AGENT=1 ;;
        --apply) APPLY=1 ;;
        --config) shift; CONFIG=${1:?--config needs a path} ;;
        --config=*) CONFIG=${1#--config=} ;;
        -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
        *) echo "start.sh: unknown option $1 (try --help)" >&2; exit 2 ;;
    esac
    shift
done

if [ -z "$CONFIG" ]; then
    if [ "$AGENT" = "1" ]; then CONFIG=conf/agent.cfg
    elif [ "$APPLY" = "1" ]; then CONFIG=conf/apply.cfg
    else CONFIG=conf/config.cfg; fi
fi
if [ "$AGENT" = "1" ] && [ "$DEMO" = "1" ]; then echo "start.sh: --agent and --demo exclude each other" >&2; exit 2; fi
if [ "$APPLY" = "1" ] && { [ "$DEMO" = "1" ] || [ "$AGENT" = "1" ]; }; then
    echo "start.sh: --apply goes alone (not with --demo or --agent)" >&2; exit 2
fi

NEED_MARIADB=$DEMO
NEED_POSTGRES=0
if [ "$DEMO" = "1" ] && [ "$DEMO_KIND" = "postgresql" ]; then NEED_POSTGRES=1; EXTRAS=postgresql; export EXTRAS; fi
NEED_ETCD=0
if [ "$DEMO" = "1" ] && [ "$DEMO_KIND" = "ha" ]; then NEED_ETCD=1; fi
export NEED_MARIADB NEED_POSTGRES NEED_ETCD
. "$ROOT/scripts/bootstrap.sh" || { echo "start.sh: set-up failed" >&2; exit 1; }
PYBIN="$VENV/bin/python"

# the full demo's broker, Kafka client, pyspark and Java: in a subshell, so that a part that cannot be
# installed here only skips that part (the demo says which and why) instead of stopping the demo
if [ "$DEMO" = "1" ] && [ "$DEMO_KIND" = "full" ]; then
    # the delta extra first, on its own: it pins PySpark 4.2 (Delta Lake's runtime: the demo's lake is Delta tables
    # then), which the demo and spark extras accept; where it cannot install, the rest still does, and the demo's
    # lake is the Parquet changelog (the demo says why)
    ( EXTRAS=delta; export EXTRAS; . "$ROOT/scripts/bootstrap.sh" ) \
        || echo "start.sh: the delta extra could not be installed; the demo's lake is the Parquet changelog" >&2
    ( EXTRAS=demo,spark NEED_KAFKA=1; export EXTRAS NEED_KAFKA; . "$ROOT/scripts/bootstrap.sh" ) \
        || echo "start.sh: not everything the full demo uses could be installed; it runs what it can" >&2
fi

if [ "$APPLY" = "1" ]; then
    NEEDED=$("$PYBIN" -m capturer apply --config "$CONFIG" --print-extras 2>/dev/null)
    if [ -n "$NEEDED" ]; then
        EXTRAS="$NEEDED"; export EXTRAS
        . "$ROOT/scripts/bootstrap.sh" || { echo "start.sh: installing $NEEDED failed" >&2; exit 1; }
    fi
    "$PYBIN" -m capturer apply --config "$CONFIG" --check >/dev/null 2>"$ROOT/.check.err"
    rc=$?
    if [ $rc -ne 0 ]; then cat "$ROOT/.check.err" >&2; rm -f "$ROOT/.check.err"; exit $rc; fi
    rm -f "$ROOT/.check.err"
    if [ "$FOREGROUND" = "1" ]; then exec "$PYBIN" -m capturer apply --config "$CONFIG"; fi
    mkdir -p log
    if [ -f log/apply.pid ] && kill -0 "$(cat log/apply.pid)" 2>/dev/null; then
        echo "start.sh: an applier is already running (pid $(cat log/apply.pid)); sh stop.sh --apply first" >&2
        exit 1
    fi
    nohup "$PYBIN" -m capturer apply --config "$CONFIG" >>log/apply.log 2>&1 &
    echo $! > log/apply.pid
    sleep 2
    if ! kill -0 "$(cat log/apply.pid)" 2>/dev/null; then
        echo "start.sh: the applier exited at once; last lines of log/apply.log:" >&2
        tail -n 20 log/apply.log >&2
        rm -f log/apply.pid
        exit 1
    fi
    echo "applier started (pid $(cat log/apply.pid)); log: log/apply.log; stop: sh stop.sh --apply"
    exit 0
fi

if [ "$AGENT" = "1" ]; then
    "$PYBIN" -m capturer.agent --config "$CONFIG" --check >/dev/null 2>"$ROOT/.check.err"
    rc=$?
    if [ $rc -ne 0 ]; then cat "$ROOT/.check.err" >&2; rm -f "$ROOT/.check.err"; exit $rc; fi
    rm -f "$ROOT/.check.err"
    if [ "$FOREGROUND" = "1" ]; then exec "$PYBIN" -m capturer.agent --config "$CONFIG"; fi
    mkdir -p log
    if [ -f log/agent.pid ] && kill -0 "$(cat log/agent.pid)" 2>/dev/null; then
        echo "start.sh: an agent is already running (pid $(cat log/agent.pid)); sh stop.sh --agent first" >&2
        exit 1
    fi
    nohup "$PYBIN" -m capturer.agent --config "$CONFIG" >>log/agent.log 2>&1 &
    echo $! > log/agent.pid
    sleep 2
    if ! kill -0 "$(cat log/agent.pid)" 2>/dev/null; then
        echo "start.sh: the agent exited at once; last lines of log/agent.log:" >&2
        tail -n 20 log/agent.log >&2
        rm -f log/agent.pid
        exit 1
    fi
    echo "agent started (pid $(cat log/agent.pid)); log: log/agent.log; stop: sh stop.sh --agent"
    exit 0
fi

# install what the configured senders need (pyspark and Java for spark, confluent-kafka)
if [ "$DEMO" = "0" ]; then
    NEEDED=$("$PYBIN" -m capturer --config "$CONFIG" --print-extras 2>/dev/null)
    if [ -n "$NEEDED" ]; then
        EXTRAS="$NEEDED"
        export EXTRAS
        . "$ROOT/scripts/bootstrap.sh" || { echo "start.sh: installing $NEEDED failed" >&2; exit 1; }
    fi
fi

if [ "$DEMO" = "1" ]; then
    if [ "$ONCE" = "1" ]; then exec "$PYBIN" -m capturer --demo "$DEMO_KIND" --once
    else exec "$PYBIN" -m capturer --demo "$DEMO_KIND"
    fi
fi

# refuse a bad config now, in the foreground, with its exit code (2)
"$PYBIN" -m capturer --config "$CONFIG" --check >/dev/null 2>"$ROOT/.check.err"
rc=$?
if [ $rc -ne 0 ]; then cat "$ROOT/.check.err" >&2; rm -f "$ROOT/.check.err"; exit $rc; fi
rm -f "$ROOT/.check.err"

if [ "$FOREGROUND" = "1" ]; then
    exec "$PYBIN" -m capturer --config "$CONFIG"
fi

mkdir -p log
PIDFILE=log/capturer.pid
if [ -f "$PIDFILE" ] && kill -0 "$(cat "$PIDFILE")" 2>/dev/null; then
    echo "start.sh: already running (pid $(cat "$PIDFILE")); sh stop.sh first" >&2
    exit 1
fi
nohup "$PYBIN" -m capturer --config "$CONFIG" >>log/capturer.log 2>&1 &
echo $! > "$PIDFILE"
sleep 2
if ! kill -0 "$(cat "$PIDFILE")" 2>/dev/null; then
    echo "start.sh: the capturer exited at once; last lines of log/capturer.log:" >&2
    tail -n 20 log/capturer.log >&2
    rm -f "$PIDFILE"
    exit 1
fi
echo "capturer started (pid $(cat "$PIDFILE")); log: log/capturer.log; stop: sh stop.sh"
