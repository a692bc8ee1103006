"""Unchanged TOASTed values of a PostgreSQL region's updates, read from the table
(``fill_toast``) once the transaction is visible to the read (``await_visible``).

The region is a PostgresRegion, typed Any: region.py imports this module."""

from __future__ import annotations

import logging
import time
from typing import Any

from capturer.errors import SourceError
from capturer.regions.postgresql import pgoutput as po
from capturer.regions.postgresql.relations import RelDef, quote_pg
from capturer.regions.postgresql.snapshot import PgSnapshot
from capturer.regions.postgresql.types import Unrepresentable

log = logging.getLogger("capturer.regions.postgresql.region")  # (the region's logger: its messages as before)


def await_visible(region: Any, xid: int) -> bool:
    """Wait until transaction ``xid`` (delivered: it committed) is visible to new
    snapshots of the ordinary connection; False if it is not after ``toast_wait_ms``.

    PostgreSQL's walsender sends a transaction once its commit record is flushed,
    which can be before the committing backend leaves the ProcArray (under CPU
    load, for a while; a synchronous standby holds it there until it answers).
    A read in that window sees the row as it was before the transaction: no row at
    a new key, the old value of a column. So the fill first takes a snapshot
    (``pg_current_snapshot()``) and checks ``xid`` against it as the snapshot
    engine's chunk reads do (``PgSnapshot.visible``: not in progress, below xmax);
    once a snapshot sees it, every later one does (a completed transaction never
    comes back into the ProcArray), so the fill's own read, a later statement,
    sees it too. Checked once per transaction (the answer is kept for its other
    rows), and not at all when the last snapshot taken already sees it (a
    capturer behind the source). Waits are counted in ``toast_waits`` and
    ``toast_wait_ms``; one given up in ``toast_wait_timeouts`` (with a warning;
    the transaction's other rows then read at once: True)."""
    if xid == region._xid_checked:
        return True
    if region._last_snap is not None and region._last_snap.visible(xid):
        region._xid_checked = xid
        return True
    started = time.monotonic()
    deadline = started + region.cfg.toast_wait_ms / 1000.0
    delay, waited = 0.0005, False
    while True:
        (text,), = region._query(f"SELECT {region._snapshot_fn}::text")
        region._last_snap = snap = PgSnapshot.parse(str(text))
        if snap.visible(xid):
            break
        if not waited:
            waited = True
            region.toast_waits += 1
        if time.monotonic() >= deadline or region.ctx.stop.wait(delay):
            region.toast_wait_ms += (time.monotonic() - started) * 1000.0
            if not region.ctx.stop.is_set():
                region.toast_wait_timeouts += 1
                log.warning("%s: transaction %d stayed invisible to other sessions for %d ms after it was "
                            "delivered (a synchronous standby that does not answer?): its unchanged TOASTed "
                            "values are read anyway (toast_wait_ms)", region.where, xid, region.cfg.toast_wait_ms)
            region._xid_checked = xid  # (once per transaction: its other rows do not wait again)
            return False
        delay = min(delay * 2, 0.02)
    if waited:
        region.toast_wait_ms += (time.monotonic() - started) * 1000.0
    region._xid_checked = xid
    return True


def fill_toast(region: Any, rel: RelDef, row: dict[str, Any], cols: list[str], tup: po.Tuple,
               xid: int) -> None:
    """Unchanged TOASTed values (not in the log under REPLICA IDENTITY DEFAULT): read
    from the table by the row's new key, once transaction ``xid`` (the one being
    decoded) is visible to the read (``await_visible``: never before, or a row
    that exists would look gone). The value read is the row's current one: the
    same one unless a later transaction changed it, and then that transaction
    carries the newer value too. A row deleted or moved to another key since
    (by a later transaction, which the stream delivers after this one) keeps the
    columns out of the image and counts in ``toast_missing``; so does a read that
    fails (the table or a column renamed, dropped or retyped since), and every
    such update when ``toast_fill`` is off or the table has no primary key.
    Senders never make up values for columns left out (docs/senders.md)."""
    texts = {c.name: text for c, (kind, text) in zip(rel.columns, tup) if kind == po.TEXT}
    if not region.cfg.toast_fill or not rel.pk or not all(k in texts for k in rel.pk):
        region.toast_missing += 1
        return
    types = dict(zip((c.name for c in rel.columns), rel.types))
    # the values in their output form (format('%s', c), as the log writes them; c::text differs for some
    # types), the key as the log wrote it: a parameter of unknown type, so the server reads it as the key's type
    sel = ", ".join(f"CASE WHEN {quote_pg(c)} IS NULL THEN NULL ELSE format('%%s', {quote_pg(c)}) END" for c in cols)
    where = " AND ".join(f"{quote_pg(k)} = %s" for k in rel.pk)
    keyvals = [texts[k] for k in rel.pk]
    import psycopg

    await_visible(region, xid)
    try:
        got = region._query(f"SELECT {sel} FROM {quote_pg(rel.db)}.{quote_pg(rel.table)} WHERE {where} LIMIT 1",
                            keyvals)
    except SourceError:
        raise
    except psycopg.Error as exc:  # the table or column was renamed or dropped since
        log.warning("%s: cannot read unchanged TOASTed values of %s.%s: %s", region.where, rel.db, rel.table,
                    str(exc).strip())
        got = []
    if not got:
        region.toast_missing += 1
        return
    for c, v in zip(cols, got[0]):
        try:
            row[c] = None if v is None else types[c].parse(v)
        except Unrepresentable:
            row[c] = None
        except ValueError:  # the column's type changed since: left as it is downstream
            region.toast_missing += 1
            return
    region.toast_filled += 1
