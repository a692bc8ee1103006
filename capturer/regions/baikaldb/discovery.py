"""A BaikalDB region's discovery through the meta servers: the binlog table and
the source tables linked to it (``linked``), its binlog regions and partitions
(``discover``), where each binlog region starts (``choose_starts`` at the first
start, ``new_region_start`` for one that appears while streaming), and the
refresh of schemas and regions in a thread of its own (``start_refresh``).

The region is a BaikalRegion, typed Any: region.py imports this module."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from capturer.errors import FatalSourceError, SourceError
from capturer.model import TsPosition
from capturer.regions.baikaldb.client import MetaClient, PeerFailure, StoreClient, StoreRegionInfo
from capturer.regions.baikaldb.epochs import Epoch
from capturer.regions.baikaldb.schema import TableDef, linked_binlog_tables
from capturer.regions.baikaldb.tso import describe, from_unix_ms

log = logging.getLogger("capturer.regions.baikaldb.region")  # (the region's logger: its messages as before)


def linked(region: Any, meta: MetaClient | None = None) -> tuple[Any, dict[int, TableDef], int]:
    """(the binlog table's SchemaInfo, the source tables linked to it, the partitions)."""
    schemas = (meta or region.meta).query_schemas()
    tid = region.cfg.binlogTableID
    binlog = next((s for s in schemas if int(s.table_id) == tid), None)
    if binlog is None:
        raise FatalSourceError(f"{region.where}: the meta servers know no table with id {tid}; check "
                               "binlogTableID (QUERY_SCHEMA lists every table's table_id)")
    if binlog.engine != 4 and not binlog.is_binlog:  # Engine BINLOG
        raise FatalSourceError(f"{region.where}: table {tid} ({binlog.database}.{binlog.table_name}) is not a "
                               "binlog table (ENGINE=Binlog); binlogTableID must name the binlog table")
    targets = set(binlog.binlog_info.target_table_ids) if binlog.HasField("binlog_info") else set()
    defs = {}
    for s in schemas:
        if s.deleted or int(s.table_id) == tid:
            continue
        if tid in linked_binlog_tables(s) or int(s.table_id) in targets:
            d = TableDef.from_schema_info(s)
            defs[d.table_id] = d
    region.binlog_table = f"{binlog.database}.{binlog.table_name}"
    return binlog, defs, max(1, int(binlog.partition_num or 1))


def discover(region: Any) -> None:
    region.meta.find_leader()
    _, defs, parts = region._linked()
    if not region._initialised:
        region._init_schemas(defs)
        region._initialised = True
    else:
        region._note_versions(defs, region._now_tso())
    regions = region.meta.query_regions(region.cfg.binlogTableID)
    if region.cfg.binlogRegionID:
        want = set(region.cfg.binlogRegionID)
        missing = want - {int(r.region_id) for r in regions}
        if missing:
            raise FatalSourceError(f"{region.where}: binlogRegionID {sorted(missing)} is not a region of binlog "
                                   f"table {region.cfg.binlogTableID} (it has "
                                   f"{sorted(int(r.region_id) for r in regions)})")
        regions = [r for r in regions if int(r.region_id) in want]
    if not regions:
        raise SourceError(f"{region.where}: the meta servers list no region of binlog table "
                          f"{region.cfg.binlogTableID}")
    set_partitions(region, parts, regions)
    for r in regions:
        rid = int(r.region_id)
        if rid in region.stores:
            region.stores[rid].update_from_pb(r)
        else:
            region.stores[rid] = StoreRegionInfo.from_pb(r)
    region._last_refresh = time.monotonic()
    if not region._starts:
        choose_starts(region)


def set_partitions(region: Any, partition_num: int, regions: list[Any]) -> None:
    """Partitions only grow (joining the parts of a transaction must not switch
    off because one answer lacked ``partition_num``)."""
    region.partitions = max(region.partitions, partition_num, len({int(r.partition_id) for r in regions}))


def choose_starts(region: Any) -> None:
    pos = region.ctx.start
    if isinstance(pos, TsPosition):
        region._starts = {rid: pos.resume_ts(rid) for rid in region.stores}
        if pos.epoch == 0:  # stopped within the first start's CREATE statements
            region._first_ddl(pos.ts)
        return
    start = region.cfg.start
    starts: dict[int, int] = {}
    if start == "earliest":
        client = StoreClient(region.where, region.cfg.connect_timeout, region.cfg.request_timeout, 1e9)
        try:
            for rid, sr in region.stores.items():
                starts[rid] = client.oldest_ts(sr)
        finally:
            client.close()
    elif start == "latest":
        starts = dict.fromkeys(region.stores, region._now_tso())
    elif start.isdigit():
        starts = dict.fromkeys(region.stores, int(start))
    else:
        import datetime as dt

        ms = int(dt.datetime.fromisoformat(start).timestamp() * 1000)
        starts = dict.fromkeys(region.stores, from_unix_ms(ms))
    region._starts = starts
    first = min(region._starts.values())
    region.last_emitted = first
    log.info("%s: first start at TSO %s (start=%s)", region.where, describe(first), start)
    if region.cfg.create_tables:
        # the schemas the CREATE statements are made from, named by the last of them
        region.epoch = region.journal.next_epoch()
        region.journal.write(region.epoch, Epoch(dict(region.tables), first, first, first=True))
    # durable before anything leaves: a crash before the first checkpoint resumes
    # from these starts (start=latest or a time is not chosen again); epoch 0 while
    # the first start's CREATE statements are still to be sent
    region.ctx.pin_start(region.name, region._position(first, 0 if region.cfg.create_tables else None))
    region._first_ddl(first)


def new_region_start(region: Any, sr: StoreRegionInfo, resume: int) -> int:
    """Where a binlog region that appeared while streaming is read from: the point
    the stream has reached, or its oldest binlog if that is later (a region made
    after that point holds nothing before it)."""
    client = StoreClient(region.where, region.cfg.connect_timeout, region.cfg.request_timeout, 1e9)
    try:
        oldest = client.oldest_ts(sr)
    except (SourceError, FatalSourceError, PeerFailure) as exc:
        log.warning("%s: new binlog region %d: its oldest binlog is unknown (%s); reading it from TSO %s",
                    region.where, sr.region_id, exc, describe(resume))
        return resume
    finally:
        client.close()
    start = max(resume, oldest)
    log.info("%s: new binlog region %d (partition %d): reading it from TSO %s%s", region.where, sr.region_id,
             sr.partition_id, describe(start), " (where its binlog begins)" if oldest > resume else "")
    return start


def start_refresh(region: Any) -> None:
    """Schemas and regions from the meta, in a thread of its own: a slow or dead
    meta never holds up the merge (nor, through it, the other regions)."""
    region._last_refresh = time.monotonic()
    if region._refreshing:
        return
    region._refreshing = True
    threading.Thread(target=refresh, args=(region,), name=f"baikaldb-{region.name}-refresh", daemon=True).start()


def refresh(region: Any) -> None:
    """(the refresher thread) What the meta says now, handed to the stream under the
    region's lock: the schemas with a TSO taken after them, regions not seen before."""
    cfg = region.cfg
    meta = MetaClient(list(cfg.metaServer), cfg.connect_timeout, cfg.request_timeout, region.where)
    try:
        _, defs, parts = region._linked(meta)
        obs = region._now_tso(meta)
        regions = meta.query_regions(cfg.binlogTableID)
        with region._lock:
            region._refreshed = (defs, obs)
            set_partitions(region, parts, regions)
            for r in regions:
                rid = int(r.region_id)
                if rid in region.stores:
                    region.stores[rid].update_from_pb(r, trust_leader=False)
                elif not cfg.binlogRegionID or rid in cfg.binlogRegionID:
                    region._new_regions.append(r)
    except (SourceError, FatalSourceError, PeerFailure) as exc:
        # a meta that answers oddly for a while is no reason to stop: the stream goes on
        # with what it knows, and the next refresh tries again
        region.counters["refresh_failures"] += 1
        log.warning("%s: schema/region refresh failed: %s", region.where, exc)
    except Exception:
        region.counters["refresh_failures"] += 1
        log.exception("%s: schema/region refresh failed", region.where)
    finally:
        meta.close()
        region._refreshing = False
