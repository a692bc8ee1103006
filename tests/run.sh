#!/bin/sh
# The one test command: sets everything up on a fresh machine (virtualenv, Python packages, mariadb-server,
# postgresql, etcd-server, chromium, a Java runtime for Spark and Apache Kafka, Maven (Kafka's jars) and, as root, iproute2 via apt-get where missing), then runs
# the unit and integration tests. Lint (ruff) runs first, in seconds, before anything heavy is installed;
# the type check (mypy) right after the project is installed, before the servers. Extra arguments go to pytest:
#   sh tests/run.sh -k merger        sh tests/run.sh --runslow  (every slow case too)
# The console shows the slowest 40 tests; tests/artifacts/durations.txt gets every test's setup, call and
# teardown time and each file's total (slowest first), so a run shows where all of its time went.
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT" || exit 1

# 1. lint: a virtualenv with ruff only (seconds), so a lint error fails before any install
NEED_MARIADB=0 NEED_POSTGRES=0 NEED_CHROMIUM=0 NEED_IPROUTE=0 BOOTSTRAP_LINT_ONLY=1
export NEED_MARIADB NEED_POSTGRES NEED_CHROMIUM NEED_IPROUTE BOOTSTRAP_LINT_ONLY
. "$ROOT/scripts/bootstrap.sh" || { echo "tests/run.sh: set-up (lint) failed" >&2; exit 1; }
echo "tests/run.sh: ruff" >&2
"$VENV/bin/ruff" check capturer senders devtools tests bench || { echo "tests/run.sh: ruff failed" >&2; exit 1; }

# 2. the project and its Python packages, then the type check
BOOTSTRAP_LINT_ONLY=0
# delta before spark: the delta extra pins PySpark 4.2 (Delta 4.4.0 runs on Spark 4.2 only), which the spark
# extra accepts, so every Spark test runs on 4.2 and the Delta tests run instead of skipping (docs/testing.md)
EXTRAS=test,delta,spark,confluent
export BOOTSTRAP_LINT_ONLY EXTRAS
. "$ROOT/scripts/bootstrap.sh" || { echo "tests/run.sh: set-up failed" >&2; exit 1; }
echo "tests/run.sh: mypy" >&2
"$VENV/bin/mypy" || { echo "tests/run.sh: mypy failed" >&2; exit 1; }

# 3. the servers the integration tests start privately, then the tests
NEED_MARIADB=1 NEED_POSTGRES=1 NEED_CHROMIUM=1 NEED_IPROUTE=1 NEED_ETCD=1 NEED_KAFKA=1
export NEED_MARIADB NEED_POSTGRES NEED_CHROMIUM NEED_IPROUTE NEED_ETCD NEED_KAFKA
. "$ROOT/scripts/bootstrap.sh" || { echo "tests/run.sh: set-up failed" >&2; exit 1; }
# two test files at a time (pytest-xdist, one file per worker: a file's shared servers stay in one process); most
# of a test's time is waiting on servers, kill -9 and catch-up, so two workers on two cores take ~2/3 of the serial
# time. TEST_WORKERS=0 runs them one after the other (as before 2026-11-28); more cores: TEST_WORKERS=4
exec "$VENV/bin/python" -m pytest tests -n "${TEST_WORKERS:-2}" --dist loadfile \
    --durations-file=tests/artifacts/durations.txt "$@"
