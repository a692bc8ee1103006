"""Micro-bench: DECIMAL values made at the MySQL rows decoder and at the applier (issue 50), no server, one
process.

    PYTHONPATH=<tree> .venv/bin/python bench/decimal_decode.py

* 1,000 insert rows of DECIMAL(12,2) and DECIMAL(10,3) (the bench table's two; random values written as a
  binlog rows event writes them, by tests/unit/test_fuzz_c.py's encoder) decoded by the C ``Plan.rows`` 200
  times;
* 100,000 row images of the applier with those two columns as the json format carries them (texts) made
  values by ``kafka_untype`` (capturer/apply/regroup.py's typed columns).

CPU per row, best of 7 and of 5. Run it from each tree in turn to compare two versions.
"""

from __future__ import annotations

import decimal
import random
import sys
import time
from pathlib import Path


def main() -> None:
    from capturer import _fastrows  # (first: the fuzz test's module would put its own tree first)

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "unit"))  # (its encoder)
    from test_fuzz_c import enc_decimal

    rng = random.Random(3)
    plan = _fastrows.Plan(("price", "qty"), ((6, 12, 2), (6, 10, 3)))
    body = b"".join(b"\x00" + enc_decimal(rng, 12, 2)[0] + enc_decimal(rng, 10, 3)[0] for _ in range(1000))
    best = float("inf")
    for _ in range(7):
        t = time.process_time()
        for _ in range(200):
            plan.rows(body, False)
        best = min(best, time.process_time() - t)
    print(f"rows decoder, us per row (2 DECIMAL columns): {best / 200_000 * 1e6:.3f}")

    convs = (("price", decimal.Decimal, ArithmeticError), ("qty", decimal.Decimal, ArithmeticError))
    images = [{"id": i, "price": f"{i}.{i % 100:02d}", "qty": f"{i % 1000}.{i % 7:03d}"} for i in range(100_000)]
    best = float("inf")
    for _ in range(5):
        work = [dict(d) for d in images]
        t = time.process_time()
        for d in work:
            _fastrows.kafka_untype(d, convs, frozenset())
        best = min(best, time.process_time() - t)
    print(f"applier's kafka_untype, us per row (2 DECIMAL columns): {best / 100_000 * 1e6:.3f}")


if __name__ == "__main__":
    main()
