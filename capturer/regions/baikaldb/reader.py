"""A BaikalDB region's per-store-region reader (``fetch``): one thread per binlog
region polls ``OP_READ_BINLOG`` from its resume ts through a ``StoreClient``
(leaders followed, dead peers skipped, followers read when the leader lags),
parses each entry and hands it to the region's merge through a bounded queue;
after repeated failures it asks the meta for the region's peers and leader
(``refresh_region``).

The region is a BaikalRegion, typed Any: region.py imports this module."""

from __future__ import annotations

import logging
import threading
from typing import Any

from capturer.errors import FatalSourceError, SourceError
from capturer.regions.baikaldb.client import BinlogPurged, MetaClient, PeerFailure, StoreClient, StoreRegionInfo
from capturer.regions.baikaldb.rows import Entry, RowDecodeError, parse_entry
from capturer.util.bqueue import Closed, WeightedQueue

log = logging.getLogger("capturer.regions.baikaldb.region")  # (the region's logger: its messages as before)


def fetch(region: Any, sr: StoreRegionInfo, q: WeightedQueue[Entry], wake: threading.Event,
          stop: threading.Event, next_ts: int) -> None:
    """One binlog region's reader for one attempt of the region's ``_stream``. Its
    read position is its own (``next_ts``): a reader of an earlier attempt that is
    still inside a call cannot move it; shared state is written only while this
    attempt is on (``stop`` not set)."""
    cfg = region.cfg
    client = StoreClient(region.where, cfg.connect_timeout, cfg.request_timeout, cfg.follower_read_after,
                         region._on_new_regions)
    meta = MetaClient(list(cfg.metaServer), cfg.connect_timeout, cfg.request_timeout, region.where)
    delay, fails = 0.2, 0
    sr.state = "streaming"
    try:
        while not stop.is_set() and not region.ctx.stop.is_set():
            try:
                res = client.read(sr, next_ts, cfg.read_batch)
            except PeerFailure as exc:
                if stop.is_set():
                    break
                fails += 1
                sr.retries += 1
                sr.state = "retrying"
                sr.last_error = str(exc)
                if fails == 1 or fails % 10 == 0:
                    log.warning("%s: binlog region %d: %s (attempt %d; retrying in %.1fs)", region.where,
                                sr.region_id, exc, fails, delay)
                if exc.refresh or fails % 3 == 0:
                    refresh_region(region, sr, meta)
                if stop.wait(delay):
                    break
                delay = min(delay * 2, 5.0)
                continue
            if stop.is_set():
                break
            if fails:
                log.info("%s: binlog region %d: reading again (from %s)", region.where, sr.region_id, res.peer)
            delay, fails = 0.2, 0
            sr.state = "streaming"
            sr.serving_peer = res.peer
            sr.reads += 1
            if not res.entries:
                stop.wait(cfg.poll_ms / 1000)
                continue
            for ts, payload in res.entries:
                e = parse_entry(region.pb, payload, ts, sr.region_id)
                if e.fake:
                    sr.fakes += 1
                else:
                    sr.entries += 1
                q.put(e, 1, stop=stop)
                wake.set()
            next_ts = res.entries[-1][0]
            sr.next_ts = next_ts
    except Closed:
        pass
    except (FatalSourceError, RowDecodeError) as exc:
        if not stop.is_set():
            sr.state = "failed"
            sr.last_error = str(exc)
            if isinstance(exc, RowDecodeError):
                exc = FatalSourceError(f"{region.where}: binlog region {sr.region_id}: {exc}")
            elif isinstance(exc, BinlogPurged) and region.ctx.start is None and cfg.start == "earliest" \
                    and next_ts == sr.start_ts:
                exc = BinlogPurged(
                    f"{exc} (This was the first read, at the oldest binlog the store reported: its first "
                    "transaction's prewrite is already purged. Set start to a later TSO or time in this "
                    "[region:...] section.)")
            region._fatal = exc
            wake.set()
    except BaseException as exc:
        if not stop.is_set():
            sr.state = "failed"
            sr.last_error = f"{type(exc).__name__}: {exc}"
            log.exception("%s: binlog region %d reader failed", region.where, sr.region_id)
            region._fatal = exc
            wake.set()
    finally:
        client.close()
        meta.close()
        if sr.state != "failed" and stop.is_set():
            sr.state = "stopped"


def refresh_region(region: Any, sr: StoreRegionInfo, meta: MetaClient) -> None:
    """Peers and leader of one region from the meta (after repeated failures;
    each reader has its own meta client, so a dead meta holds up only it)."""
    try:
        found = meta.query_regions(region.cfg.binlogTableID, [sr.region_id])
    except (SourceError, FatalSourceError) as exc:
        log.warning("%s: binlog region %d: meta refresh failed: %s", region.where, sr.region_id, exc)
        return
    sr.meta_refreshes += 1
    for r in found:
        if int(r.region_id) == sr.region_id:
            sr.update_from_pb(r)
            sr.dead_until.clear()
