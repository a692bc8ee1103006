"""The ``[region:NAME]`` keys of ``type = baikaldb`` and the section's parsing
(capturer/config.py reaches them through the region registry)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from capturer.config import p_peers
from capturer.errors import ConfigError
from capturer.util.ini import IniFile, Key, p_bool, p_choice, p_float, p_int, parse_section


@dataclass(frozen=True)
class BaikalRegionConfig:
    name: str
    type: str
    metaServer: tuple[str, ...]
    binlogTableID: int
    binlogRegionID: tuple[int, ...] = ()
    start: str = "earliest"
    read_batch: int = 1000
    poll_ms: int = 100
    connect_timeout: float = 3.0
    request_timeout: float = 15.0
    follower_read_after: float = 10.0
    schema_refresh: float = 10.0
    create_tables: bool = True
    unpaired_update: str = "error"
    region_buffer: int = 1000
    process: bool = False

    def masked(self) -> dict[str, Any]:
        return {"type": self.type, "metaServer": ",".join(self.metaServer), "binlogTableID": self.binlogTableID,
                "binlogRegionID": ",".join(map(str, self.binlogRegionID)), "start": self.start,
                "read_batch": self.read_batch, "create_tables": self.create_tables,
                "unpaired_update": self.unpaired_update}


def p_ids(v: str) -> tuple[int, ...]:
    out = []
    for x in (x.strip() for x in v.split(",")):
        if not x:
            continue
        if not x.isdigit() or int(x) <= 0 or int(x) >= 1 << 63:
            raise ValueError(f"expected positive region ids separated by commas, got {x!r}")
        out.append(int(x))
    return tuple(out)


def p_baikal_start(v: str) -> str:
    """earliest | latest | a BaikalDB TSO | a UTC time 'YYYY-MM-DD HH:MM:SS[.ffffff]'."""
    import datetime as dt

    low = v.lower()
    if low in ("earliest", "latest"):
        return low
    if v.isdigit():
        if int(v) <= 0 or int(v) >= 1 << 63:
            raise ValueError("a TSO must be a positive 64-bit integer")
        return v
    try:
        t = dt.datetime.fromisoformat(v)
    except ValueError:
        raise ValueError("expected earliest, latest, a BaikalDB TSO (an integer) or a UTC time "
                         "'YYYY-MM-DD HH:MM:SS'") from None
    if t.tzinfo is None:
        t = t.replace(tzinfo=dt.timezone.utc)
    if t.timestamp() * 1000 < 1577808000000:
        raise ValueError("a start time before 2020-01-01 (BaikalDB's TSO origin) is not a TSO")
    return t.isoformat()


KEYS = [
    Key("type", p_choice("baikaldb"), "baikaldb", doc="region kind"),
    Key("metaServer", p_peers, required=True, doc="meta server peers host:port[,host:port...]"),
    Key("binlogTableID", p_int(1, (1 << 63) - 1), required=True, doc="table id of the binlog table"),
    Key("binlogRegionID", p_ids, (), doc="only these binlog regions (comma-separated); empty = every region"),
    Key("start", p_baikal_start, "earliest",
        doc="without a checkpoint: earliest (each region's oldest binlog), latest (now), a TSO, or a UTC time"),
    Key("read_batch", p_int(1, 100_000), 1000, doc="rows asked per OP_READ_BINLOG (read_binlog_cnt)"),
    Key("poll_ms", p_int(10, 60_000), 100, doc="pause before reading a caught-up region again"),
    Key("connect_timeout", p_float(0.1, 600), 3.0),
    Key("request_timeout", p_float(1, 3600), 15.0,
        doc="seconds for one call (a store may take 10 s to answer a read)"),
    Key("follower_read_after", p_float(0, 86_400), 10.0,
        doc="ask followers when the leader has nothing and the position is this many seconds behind"),
    Key("schema_refresh", p_float(0.5, 86_400), 10.0, doc="seconds between schema and region refreshes"),
    Key("create_tables", p_bool, True,
        doc="on a first start, send CREATE TABLE IF NOT EXISTS for every source table (DDL)"),
    Key("unpaired_update", p_choice("error", "split"), "error",
        doc="an UPDATE with unequal old/new row counts: stop with an error, or split it into deletes+inserts"),
    Key("region_buffer", p_int(10, 1_000_000), 1000, doc="entries buffered per binlog region"),
    Key("process", p_bool, False,
        doc="read and decode this region in a worker process of its own (a local region agent) instead of "
            "the capturer's process: decoding then uses another core and not the senders' GIL"),
]


def parse(ini: IniFile, section: str, name: str) -> BaikalRegionConfig:
    v = parse_section(ini, section, KEYS)
    return BaikalRegionConfig(name=name, **{k: v[k] for k in v})


def claim(r: BaikalRegionConfig, ids: dict[Any, str], path: Path) -> None:
    """Refuses a second region that reads a binlog region of the same cluster's table."""
    for rid in r.binlogRegionID or (0,):
        bkey = (frozenset(r.metaServer), r.binlogTableID, rid)
        other = ids.get(bkey) or ids.get((bkey[0], bkey[1], 0))
        if other is None and rid == 0:
            other = next((n for k, n in ids.items() if k[:2] == bkey[:2]), None)
        if other is not None:
            raise ConfigError(
                f"{path}: regions [region:{other}] and [region:{r.name}] both read binlog table "
                f"{r.binlogTableID}{f' region {rid}' if rid else ''} of the same cluster")
        ids[bkey] = r.name
