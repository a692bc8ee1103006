"""BaikalDB store regions: the binlog table's regions, read over brpc's HTTP+JSON
protocol from every store that holds them, merged by commit_ts into one stream.

Modules: ``tso`` (TSO <-> commit_ts), ``brpc_json`` (brpc's json2pb rules),
``client`` (meta and store calls with leader/peer handling), ``schema`` (source
tables, their decoding plans and the DDL made from schema changes), ``rows``
(payload and row decoding), ``region`` (the region: its state, the watermark
merge, what leaves it), ``discovery`` (the binlog table, its linked tables and
regions from the meta; where each region starts; the background refresh),
``reader`` (the per-store-region reader threads), ``decode`` (a transaction's
parts decoded, with the schema switch it needs), ``epochs`` (schema epochs,
their journal, switches and the DDL that makes them).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from capturer.regions.kind import RegionKind

KIND = RegionKind("baikaldb", "capturer.regions.baikaldb.region:BaikalRegion", check="capturer.regions.baikaldb.check",
                  keys="capturer.regions.baikaldb.keys:KEYS", parse="capturer.regions.baikaldb.keys:parse",
                  claim="capturer.regions.baikaldb.keys:claim",
                  no_verify="no SQL front end", journal=True)

if TYPE_CHECKING:
    from capturer.regions.baikaldb.region import BaikalRegion  # noqa: F401
