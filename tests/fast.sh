#!/bin/sh
# The quick check for every change (< 5 minutes): ruff, mypy, the unit tests and one end-to-end test
# (two private MariaDB regions merged into the file sender, in commit order). Sets itself up as
# tests/run.sh does (virtualenv, the project, mariadb-server where missing); the full proof stays
# `sh tests/run.sh`. Extra arguments go to pytest:   sh tests/fast.sh -x
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT" || exit 1

# 1. lint first (seconds, before anything heavy is installed)
NEED_MARIADB=0 NEED_POSTGRES=0 NEED_CHROMIUM=0 NEED_IPROUTE=0 BOOTSTRAP_LINT_ONLY=1
export NEED_MARIADB NEED_POSTGRES NEED_CHROMIUM NEED_IPROUTE BOOTSTRAP_LINT_ONLY
. "$ROOT/scripts/bootstrap.sh" || { echo "tests/fast.sh: set-up (lint) failed" >&2; exit 1; }
echo "tests/fast.sh: ruff" >&2
"$VENV/bin/ruff" check capturer senders devtools tests bench || { echo "tests/fast.sh: ruff failed" >&2; exit 1; }

# 2. the project (the same extras as tests/run.sh, so mypy sees the same packages), then the type check
BOOTSTRAP_LINT_ONLY=0
EXTRAS=test,spark,confluent
export BOOTSTRAP_LINT_ONLY EXTRAS
. "$ROOT/scripts/bootstrap.sh" || { echo "tests/fast.sh: set-up failed" >&2; exit 1; }
echo "tests/fast.sh: mypy" >&2
"$VENV/bin/mypy" || { echo "tests/fast.sh: mypy failed" >&2; exit 1; }

# 3. MariaDB for the one end-to-end test, then the unit tests and that test
NEED_MARIADB=1
export NEED_MARIADB
. "$ROOT/scripts/bootstrap.sh" || { echo "tests/fast.sh: set-up failed" >&2; exit 1; }
exec "$VENV/bin/python" -m pytest tests/unit \
    "tests/integration/test_capture.py::test_two_regions_merge_in_commit_order" "$@"
