#!/bin/sh
# Benchmarks (see bench/bench.py). Sets itself up like tests/run.sh.
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT" || exit 1
NEED_MARIADB=1
NEED_POSTGRES=1
NEED_KAFKA=1
# delta before spark: the delta extra pins PySpark 4.2 (the Delta runtime), which the spark extra accepts: the
# part delta runs instead of skipping, and every Spark part runs on the Spark the tests run on
EXTRAS=test,delta,spark,confluent
export NEED_MARIADB NEED_POSTGRES NEED_KAFKA EXTRAS
. "$ROOT/scripts/bootstrap.sh" || exit 1
exec "$VENV/bin/python" bench/bench.py "$@"
