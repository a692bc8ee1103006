#!/bin/sh
# The one test command: sets everything up on a fresh machine (virtualenv,
# Python packages, mariadb-server, postgresql, chromium and, as root, iproute2 via apt-get where missing), then
# runs the unit and integration tests. Extra arguments go to pytest, e.g.
#   sh tests/run.sh -k merger        sh tests/run.sh --runslow  (every slow case too)
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT" || exit 1
NEED_MARIADB=1
NEED_POSTGRES=1
NEED_CHROMIUM=1
NEED_IPROUTE=1
EXTRAS=test,spark,confluent
export NEED_MARIADB NEED_POSTGRES NEED_CHROMIUM NEED_IPROUTE EXTRAS
. "$ROOT/scripts/bootstrap.sh" || { echo "tests/run.sh: set-up failed" >&2; exit 1; }
exec "$VENV/bin/python" -m pytest tests "$@"
