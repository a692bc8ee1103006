"""``--check --connect`` of a PostgreSQL region: wal_level, the role's REPLICATION,
the publication and the slot (and room for one still to be made), what a snapshot
needs, and advice on TOASTed columns. ``refusals``: a checkpoint position of another
kind. ``verify_source``: how ``verify`` reads the source."""

from __future__ import annotations

from typing import Any

from capturer.errors import CheckpointError
from capturer.model import LsnPosition, parse_lsn
from capturer.regions.base import require_start_kind
from capturer.regions.postgresql.keys import PostgresRegionConfig
from capturer.regions.postgresql.relations import quote_pg
from capturer.util.probe import Outcome, Probe, RegionCheck


def probe(c: RegionCheck) -> Probe:
    rc = c.config
    return Probe(f"region {rc.name} (postgresql {rc.host}:{rc.port}/{rc.dbname})", lambda out: _source(c, out),
                 f"check host, port, user, password, dbname in {c.section}")


def refusals(c: RegionCheck) -> list[str]:
    """(a PostgreSQL region refuses a position of another kind when it connects)"""
    try:
        require_start_kind(c.region.ctx, c.name, "postgresql", LsnPosition)
    except CheckpointError as exc:
        return [f"{c.checkpoint_path}: {exc}"]
    return []


def _source(c: RegionCheck, out: Outcome) -> None:
    region, rc = c.region, c.config
    where = region.where
    region._connect_side()  # the region's own connection settings
    try:
        q = region._query
        (wal_level, version, superuser, replication, user), = q(
            "SELECT current_setting('wal_level'), current_setting('server_version'), r.rolsuper, r.rolreplication, "
            "current_user::text FROM pg_roles r WHERE r.rolname = current_user")
        if wal_level != "logical":
            out.problems.append(f"{where}: wal_level is {wal_level!r}; logical decoding needs wal_level = logical "
                                "(set it in postgresql.conf, or ALTER SYSTEM SET wal_level = logical, and restart "
                                "PostgreSQL)")
        if not (superuser or replication):
            out.problems.append(f"{where}: role {user!r} has neither REPLICATION nor SUPERUSER: "
                                f"ALTER ROLE {quote_pg(user)} WITH REPLICATION")
        pub = rc.publication
        if not q("SELECT 1 FROM pg_publication WHERE pubname = %s", (pub,)):
            if rc.create_publication == "no":
                out.problems.append(
                    f"{where}: publication {pub!r} does not exist in database {rc.dbname!r}; create it "
                    f"(CREATE PUBLICATION {quote_pg(pub)} FOR ALL TABLES) or set create_publication = all")
            elif rc.create_publication == "all" and not superuser:
                out.problems.append(f"{where}: publication {pub!r} does not exist, and creating it FOR ALL TABLES "
                                    f"(create_publication = all) needs a superuser; {user!r} is not one: create it "
                                    "as one, or list the tables in create_publication")
            else:
                out.notes.append(f"{where}: publication {pub!r} does not exist: a start creates it "
                                 f"(create_publication = {rc.create_publication})")
        start = region.ctx.start
        slot = rc.slot
        rows = q("SELECT plugin, database, confirmed_flush_lsn::text, wal_status FROM pg_replication_slots "
                 "WHERE slot_name = %s", (slot,))
        if rows:
            plugin, database, confirmed, wal_status = rows[0]
            if plugin != "pgoutput" or database != rc.dbname:
                out.problems.append(f"{where}: replication slot {slot!r} uses plugin {plugin!r} in database "
                                    f"{database!r}; this region needs a pgoutput slot in {rc.dbname!r} (drop it, or "
                                    f"name another in slot =)")
            if wal_status == "lost":
                out.problems.append(f"{where}: replication slot {slot!r} lost WAL it needed (wal_status lost); "
                                    "the changes since are gone")
            if start is not None and confirmed and parse_lsn(confirmed) > start.lsn:
                out.problems.append(f"{where}: replication slot {slot!r} was confirmed up to {confirmed}, past the "
                                    f"checkpoint's LSN {start}: the changes in between are gone from it")
        elif start is not None:
            out.problems.append(f"{where}: replication slot {slot!r} does not exist, but the checkpoint needs the "
                                f"changes after LSN {start}; they are gone with the slot")
        elif not rc.create_slot:
            out.problems.append(f"{where}: replication slot {slot!r} does not exist; create it (SELECT "
                                f"pg_create_logical_replication_slot('{slot}', 'pgoutput')) or set create_slot = true")
        else:
            (slots, max_slots, senders, max_senders), = q(
                "SELECT (SELECT count(*) FROM pg_replication_slots), current_setting('max_replication_slots')::int, "
                "(SELECT count(*) FROM pg_stat_replication), current_setting('max_wal_senders')::int")
            if slots >= max_slots:
                out.problems.append(f"{where}: replication slot {slot!r} must be created, but all "
                                    f"max_replication_slots = {max_slots} are taken: raise it in postgresql.conf "
                                    "(and restart), or drop an unused slot")
            if senders >= max_senders:
                out.problems.append(f"{where}: all max_wal_senders = {max_senders} WAL senders are busy: raise it "
                                    "in postgresql.conf (and restart)")
            out.notes.append(f"{where}: replication slot {slot!r} does not exist: a start creates it "
                             "(create_slot = true)")
        if rc.snapshot != "never":
            # a snapshot reads every published table the filter selects
            unreadable = [f"{db}.{t}" for db, t, ok in region._query(
                "SELECT schemaname::text, tablename::text, has_table_privilege(format('%%I.%%I', schemaname, "
                "tablename), 'SELECT') FROM pg_publication_tables WHERE pubname = %s", (rc.publication,))
                if not ok and region.ctx.table_selected(db, t)]
            if unreadable:
                out.problems.append(f"{where}: snapshot = {rc.snapshot} copies the published tables, but role {user} "
                                    f"may not read {', '.join(unreadable[:5])}"
                                    + (f" ({len(unreadable) - 5} more)" if len(unreadable) > 5 else "")
                                    + f": GRANT SELECT ON ... TO {quote_pg(user)}")
        _toast_advice(region, rc, out)
        if not out.problems:
            out.detail = f"PostgreSQL {version}, wal_level {wal_level}, role {user}" + \
                (f", slot {slot}" if rows else "")
    finally:
        region._after_attempt()


def _toast_advice(region: Any, rc: PostgresRegionConfig, out: Outcome) -> None:
    """Published tables under REPLICA IDENTITY DEFAULT with columns PostgreSQL may TOAST:
    an update that leaves such a value unchanged does not log it, and the region reads
    it back from the table (``toast_fill``); REPLICA IDENTITY FULL logs it with the old
    row (docs/regions-postgresql.md weighs the two)."""
    tables = [f"{db}.{t}" for db, t in region._query(
        "SELECT p.schemaname::text, p.tablename::text FROM pg_publication_tables p "
        "JOIN pg_namespace n ON n.nspname = p.schemaname JOIN pg_class c ON c.relnamespace = n.oid "
        "AND c.relname = p.tablename WHERE p.pubname = %s AND c.relreplident = 'd' AND EXISTS (SELECT 1 FROM "
        "pg_attribute a WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped AND a.attlen = -1 "
        "AND a.attstorage <> 'p') ORDER BY 1, 2", (rc.publication,)) if region.ctx.table_selected(db, t)]
    if not tables:
        return
    names = ", ".join(tables[:5]) + (f" ({len(tables) - 5} more)" if len(tables) > 5 else "")
    fill = ("the region reads them back from the table by key once the transaction is visible (toast_fill)"
            if rc.toast_fill else "toast_fill = false: those changes leave the values out")
    out.notes.append(f"{region.where}: {names}: REPLICA IDENTITY DEFAULT with columns PostgreSQL may TOAST: an update "
                     f"that leaves such a value unchanged does not log it; {fill}. ALTER TABLE ... REPLICA IDENTITY "
                     "FULL logs it with the old row (no read back; more WAL per update and delete: see "
                     "docs/regions-postgresql.md)")
