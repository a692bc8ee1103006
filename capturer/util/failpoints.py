"""Fault injection at named points, for the reliability suite (``tests/chaos/``).

Off unless the environment variable ``CAPTURER_FAILPOINTS`` is set; then
``hit(name)`` costs a dict lookup. The variable holds ``;``-separated rules
``NAME=ACTION@WHEN``:

* ``ACTION``: ``kill`` (SIGKILL this process: a crash at exactly that moment),
  ``stop`` (SIGSTOP this process, sent to the thread at the point: frozen at exactly
  that moment, that thread before it takes another step, until something sends it
  SIGCONT), ``enospc`` (raise ``OSError(ENOSPC)``: a full disk) or ``eio``.
* ``WHEN``: ``N`` (the N-th hit, 1-based), ``N-M`` (hits N to M), ``N-`` (from
  the N-th on) or ``*`` (every hit).

Points: ``checkpoint.write`` (the new checkpoint is in its temp file, not yet
renamed), ``region.ddl`` (a region is about to emit a DDL), ``spill.chunk``
(a chunk of a big transaction was written to the spill file), ``spill.write``
(before writing a spill chunk), ``local.write`` (the file sender writes a block),
``backlog.write`` (a record was appended to a backlog segment), ``mysql.commit`` (a MySQL sender worker is
about to commit a chunk), ``mysql.ddl`` (a MySQL sender's DDL committed at the target, its position not written
yet), ``spark.stage`` / ``spark.commit`` / ``spark.committed`` (the lake's batch: its
files staged, its commit line about to be written, committed but not yet published), ``spark.upkeep`` (a
Delta table's OPTIMIZE/VACUUM round, per table), ``spark.alter`` (a Delta table's ALTER: a clause committed, the next not
yet), ``spark.rename`` (a Delta table's RENAME TABLE: its new
name written, its directory not moved yet), ``kafka.produce`` (after
each produce call of the Kafka sender), ``kafka.commit`` (a transactional Kafka sender's batch is
acknowledged, its transaction not committed yet), ``snapshot.begin`` / ``snapshot.chunk_read`` (a table's copy starts;
a chunk was read, not delivered), ``snapshot.group`` (a coordinated copy of a table several regions
deliver sent its TRUNCATE, not its rows yet).

A bad rule is an error naming the variable, never ignored.
"""

from __future__ import annotations

import errno
import os
import signal
import threading

ENV = "CAPTURER_FAILPOINTS"
_ACTIONS = ("kill", "stop", "enospc", "eio")


class FailpointError(ValueError):
    pass


def _parse(text: str) -> dict[str, tuple[str, int, int]]:
    rules: dict[str, tuple[str, int, int]] = {}
    for part in filter(None, (p.strip() for p in text.split(";"))):
        name, sep, spec = part.partition("=")
        action, sep2, when = spec.partition("@")
        if not sep or not name or action not in _ACTIONS:
            raise FailpointError(f"{ENV}: bad rule {part!r}; want NAME=({'|'.join(_ACTIONS)})@WHEN")
        when = when if sep2 else "*"
        try:
            if when == "*":
                lo, hi = 1, 1 << 62
            elif "-" in when:
                a, b = when.split("-", 1)
                lo, hi = int(a), (int(b) if b else 1 << 62)
            else:
                lo = hi = int(when)
        except ValueError:
            raise FailpointError(f"{ENV}: bad WHEN in {part!r}; want N, N-M, N- or *") from None
        if lo < 1 or hi < lo:
            raise FailpointError(f"{ENV}: bad range in {part!r}")
        rules[name.strip()] = (action, lo, hi)
    return rules


_RULES = _parse(os.environ.get(ENV, ""))


def set_rules(text: str) -> None:
    """Replace the rules (tests in one process; the environment variable is read at import)."""
    global _RULES
    with _LOCK:
        _RULES = _parse(text)
        _COUNTS.clear()
_COUNTS: dict[str, int] = {}
_LOCK = threading.Lock()


def hit(name: str) -> None:
    """Count a pass through the point ``name``; act if a rule says so."""
    if not _RULES:
        return
    rule = _RULES.get(name)
    if rule is None:
        return
    with _LOCK:
        n = _COUNTS[name] = _COUNTS.get(name, 0) + 1
    action, lo, hi = rule
    if not lo <= n <= hi:
        return
    if action == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if action == "stop":
        # To this thread (tgkill): the whole process stops, this thread before it returns from the call.
        # os.kill(os.getpid()) gives the signal to the main thread, and a thread of its own (a sender's)
        # ran on until the stop reached it, in about half the hits on a busy machine: a kafka.commit=stop
        # committed the very transaction it was to freeze before commit (issue 45)
        signal.pthread_kill(threading.get_ident(), signal.SIGSTOP)  # returns once the process is continued
        return
    code = errno.ENOSPC if action == "enospc" else errno.EIO
    raise OSError(code, f"{os.strerror(code)} (injected at failpoint {name}, hit {n})")
