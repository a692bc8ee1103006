"""A PostgreSQL region's setup at each connect (``prepare``): the server's settings,
the publication (created when asked), the replication slot (created on a first
start, checked against the checkpoint's LSN; snapshot=when_needed starts over when
the slot cannot give what the checkpoint needs), and the LSN to stream from.

The region is a PostgresRegion, typed Any: region.py imports this module."""

from __future__ import annotations

import logging
from typing import Any

from capturer.errors import FatalSourceError, SourceError
from capturer.model import LsnPosition, parse_lsn
from capturer.regions.base import require_start_kind
from capturer.regions.postgresql.relations import quote_pg

log = logging.getLogger("capturer.regions.postgresql.region")  # (the region's logger: its messages as before)


def prepare(region: Any) -> int:
    """Check the server, publication and slot; the LSN to start after."""
    _check_server(region)
    _ensure_publication(region)
    rows = region._query("SELECT plugin, database, confirmed_flush_lsn::text, wal_status FROM pg_replication_slots "
                         "WHERE slot_name = %s", (region.cfg.slot,))
    # a retry resumes where this process got to (the checkpoint's position only at first)
    require_start_kind(region.ctx, region.name, "postgresql", LsnPosition, remedy="")
    start = region.position if isinstance(region.position, LsnPosition) else region.ctx.start
    assert start is None or isinstance(start, LsnPosition)
    purged = False
    if start is not None and region.cfg.snapshot == "when_needed":
        rows, purged = _when_needed(region, rows, start)
        if purged:
            start = None
    if not rows:
        return _create_slot(region, start, purged)
    return _existing_slot(region, rows[0], start, purged)


def _check_server(region: Any) -> None:
    (wal_level, region._block, region._segment, version), = region._query(
        "SELECT current_setting('wal_level'), current_setting('wal_block_size')::int, "
        "(SELECT setting::bigint FROM pg_settings WHERE name = 'wal_segment_size'), "
        "current_setting('server_version_num')::int")
    # pg_current_snapshot() is PostgreSQL 13's name for txid_current_snapshot() (as in snapshot.py)
    region._snapshot_fn = "pg_current_snapshot()" if int(version) >= 130000 else "txid_current_snapshot()"
    region._last_snap, region._xid_checked = None, None
    if wal_level != "logical":
        raise FatalSourceError(
            f"{region.where}: wal_level is {wal_level!r}; logical decoding needs wal_level = logical "
            "(set it in postgresql.conf, or ALTER SYSTEM SET wal_level = logical, and restart PostgreSQL)")


def _ensure_publication(region: Any) -> None:
    import psycopg

    pub = region.cfg.publication
    if region._query("SELECT 1 FROM pg_publication WHERE pubname = %s", (pub,)):
        return
    if region.cfg.create_publication == "no":
        raise FatalSourceError(
            f"{region.where}: publication {pub!r} does not exist in database {region.cfg.dbname!r}; create it "
            f"(CREATE PUBLICATION {quote_pg(pub)} FOR ALL TABLES) or set create_publication = all")
    what = "ALL TABLES" if region.cfg.create_publication == "all" else "TABLE " + ", ".join(
        ".".join(quote_pg(p) for p in t.split(".", 1)) for t in region.cfg.create_publication.split(","))
    try:
        region._query(f"CREATE PUBLICATION {quote_pg(pub)} FOR {what}")
    except psycopg.Error as exc:
        raise FatalSourceError(f"{region.where}: cannot create publication {pub!r}: {str(exc).strip()}") from None
    log.info("%s: created publication %s FOR %s", region.where, pub, what)


def _when_needed(region: Any, rows: list[tuple[Any, ...]],
                 start: LsnPosition) -> tuple[list[tuple[Any, ...]], bool]:
    """(snapshot=when_needed, a checkpoint position) The slot's rows (none once a slot
    that lost WAL is dropped), and whether the checkpoint's position is given up (the
    slot gone, or unable to give what came after it): every table copied again."""
    slot = region.cfg.slot
    purged = False
    if rows:
        _plugin, _database, confirmed, wal_status = rows[0]
        gone = "lost WAL it needed" if wal_status == "lost" else (
            f"was confirmed up to {confirmed}, past the checkpoint's LSN {start}"
            if confirmed and parse_lsn(confirmed) > start.lsn else "")
        if gone:
            log.warning("%s: replication slot %s %s; snapshot=when_needed: copying every selected table again "
                        "(each emptied downstream first) and reading the slot from where it is", region.where,
                        slot, gone)
            if wal_status == "lost":
                region._query("SELECT pg_drop_replication_slot(%s)", (slot,))
                rows = []
            region._forget_start()
            purged = True
    if not rows and not purged:
        log.warning("%s: replication slot %s does not exist, but the checkpoint needs the changes after LSN %s; "
                    "snapshot=when_needed: creating it and copying every selected table again (each emptied "
                    "downstream first)", region.where, slot, start)
        region._forget_start()
        purged = True
    return rows, purged


def _create_slot(region: Any, start: LsnPosition | None, purged: bool) -> int:
    import psycopg

    slot = region.cfg.slot
    if start is not None:
        raise FatalSourceError(
            f"{region.where}: replication slot {slot!r} does not exist, but the checkpoint needs the changes "
            f"after LSN {start}; they are gone with the slot. Start this region again from scratch "
            "(remove it from the checkpoint) and fill the targets again, or set snapshot=when_needed "
            f"in [region:{region.name}] to copy every table again")
    if not region.cfg.create_slot:
        raise FatalSourceError(
            f"{region.where}: replication slot {slot!r} does not exist; create it "
            f"(SELECT pg_create_logical_replication_slot('{slot}', 'pgoutput')) or set create_slot = true")
    try:
        (lsn,), = region._query("SELECT lsn::text FROM pg_create_logical_replication_slot(%s, 'pgoutput')",
                                (slot,))
    except SourceError:
        raise
    except psycopg.Error as exc:
        raise FatalSourceError(f"{region.where}: cannot create replication slot {slot!r}: "
                               f"{str(exc).strip()}") from None
    log.info("%s: created replication slot %s at %s", region.where, slot, lsn)
    region.slot_confirmed = lsn
    return _start_at(region, parse_lsn(lsn), purged)


def _existing_slot(region: Any, row: tuple[Any, ...], start: LsnPosition | None, purged: bool) -> int:
    slot = region.cfg.slot
    plugin, database, confirmed, wal_status = row
    if plugin != "pgoutput" or database != region.cfg.dbname:
        raise FatalSourceError(
            f"{region.where}: replication slot {slot!r} uses plugin {plugin!r} in database {database!r}; "
            f"this region needs a pgoutput slot in {region.cfg.dbname!r}")
    if wal_status == "lost":
        raise FatalSourceError(f"{region.where}: replication slot {slot!r} lost WAL it needed (wal_status lost, "
                               "max_slot_wal_keep_size); the changes since are gone")
    region.slot_confirmed = confirmed or ""
    slot_at = parse_lsn(confirmed) if confirmed else 0
    if start is None:
        return _start_at(region, slot_at, purged)
    if slot_at > start.lsn:
        raise FatalSourceError(
            f"{region.where}: replication slot {slot!r} was confirmed up to {confirmed}, past the checkpoint's "
            f"LSN {start}: another consumer read this slot, or the checkpoint is older than the slot; the "
            "changes in between are gone from it (snapshot=when_needed copies every table again then)")
    region._start_snapshot(fresh=False)
    return start.lsn


def _start_at(region: Any, at: int, purged: bool) -> int:
    """A first start (or one over again) from the slot's LSN ``at``: with snapshot=initial or
    when_needed, every table copied (``purged``: each emptied downstream first)."""
    if region.cfg.snapshot in ("initial", "when_needed"):
        region._start_snapshot(fresh=True, at=at, truncate=purged)
        return at
    region.position = LsnPosition(at)
    region.ctx.pin_start(region.name, region.position)
    return at
