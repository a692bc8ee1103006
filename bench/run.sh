#!/bin/sh
# Benchmarks (see bench/bench.py). Sets itself up like tests/run.sh.
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT" || exit 1
NEED_MARIADB=1
NEED_POSTGRES=1
NEED_KAFKA=1
EXTRAS=test,spark,confluent
export NEED_MARIADB NEED_POSTGRES NEED_KAFKA EXTRAS
. "$ROOT/scripts/bootstrap.sh" || exit 1
exec "$VENV/bin/python" bench/bench.py "$@"
