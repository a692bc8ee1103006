"""``--check --connect`` of a BaikalDB region: the meta servers answer and know the
binlog table's regions (and the ones binlogRegionID names)."""

from __future__ import annotations

from capturer.regions.baikaldb.client import MetaClient
from capturer.util.probe import Outcome, Probe, RegionCheck


def probe(c: RegionCheck) -> Probe:
    rc = c.config
    return Probe(f"region {rc.name} (baikaldb meta {','.join(rc.metaServer)})", lambda out: _source(c, out),
                 f"check metaServer in {c.section}")


def _source(c: RegionCheck, out: Outcome) -> None:
    rc, timeout = c.config, c.timeout
    where = f"region {rc.name} (BaikalDB binlog table {rc.binlogTableID})"
    meta = MetaClient(list(rc.metaServer), min(rc.connect_timeout, timeout), timeout, where)
    try:
        regions = meta.query_regions(rc.binlogTableID)
    finally:
        meta.close()
    ids = {int(r.region_id) for r in regions}
    if not ids:
        out.problems.append(f"{where}: the meta server knows no region of table {rc.binlogTableID}: check "
                            f"binlogTableID in [region:{rc.name}]")
    missing = sorted(set(rc.binlogRegionID) - ids)
    if ids and missing:
        out.problems.append(f"{where}: binlogRegionID {','.join(map(str, missing))} is not a region of table "
                            f"{rc.binlogTableID} (it has {','.join(map(str, sorted(ids)))})")
    out.detail = f"the meta answered: {len(ids)} binlog region(s)"
