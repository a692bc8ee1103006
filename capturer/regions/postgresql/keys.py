"""The ``[region:NAME]`` keys of ``type = postgresql`` and the section's parsing
(capturer/config.py reaches them through the region registry)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from capturer.errors import ConfigError
from capturer.regions.snapshot_keys import snapshot_keys
from capturer.util.ini import IniFile, Key, p_bool, p_choice, p_float, p_int, p_nonempty, p_str, parse_section


@dataclass(frozen=True)
class PostgresRegionConfig:
    name: str
    type: str
    host: str
    port: int
    user: str
    dbname: str
    password: str = field(default="", repr=False)
    slot: str = ""
    create_slot: bool = True
    publication: str = ""
    create_publication: str = "no"
    heartbeat_ms: int = 500
    heartbeat_lag_ms: int = 1000
    status_interval: float = 10.0
    connect_timeout: float = 10.0
    sslmode: str = "prefer"
    ddl: bool = True
    toast_fill: bool = True
    toast_wait_ms: int = 5000
    snapshot: str = "never"
    snapshot_workers: int = 2
    snapshot_chunk_rows: int = 20_000
    snapshot_read_ahead: bool = False
    process: bool = False
    publication_check_s: float = 10.0

    def masked(self) -> dict[str, Any]:
        return {"type": self.type, "host": self.host, "port": self.port, "user": self.user,
                "password": "***" if self.password else "", "dbname": self.dbname, "slot": self.slot,
                "publication": self.publication, "create_publication": self.create_publication}

_SLOT = re.compile(r"^[a-z0-9_]{1,63}$")


def p_slot(v: str) -> str:
    if not _SLOT.match(v):
        raise ValueError("a replication slot name is 1-63 of a-z 0-9 _")
    return v


def p_create_publication(v: str) -> str:
    """no | all | schema.table[,schema.table...]"""
    low = v.strip().lower()
    if low in ("no", "all"):
        return low
    tables = [t.strip() for t in v.split(",") if t.strip()]
    if not tables or not all(re.fullmatch(r"[^.\s]+\.[^.\s]+", t) for t in tables):
        raise ValueError("expected no, all, or schema.table[,schema.table...]")
    return ",".join(tables)


KEYS = [
    Key("type", p_choice("postgresql"), "postgresql", doc="region kind: a PostgreSQL logical replication slot"),
    Key("host", p_nonempty, required=True),
    Key("port", p_int(1, 65535), 5432),
    Key("user", p_nonempty, required=True, doc="a role with REPLICATION (and SELECT on the published tables)"),
    Key("password", p_str, "", secret=True),
    Key("dbname", p_nonempty, required=True, doc="the database whose changes are read"),
    Key("slot", p_slot, "", doc="logical replication slot (pgoutput); empty = capturer_<region name>"),
    Key("create_slot", p_bool, True, doc="create the slot on a first start when it does not exist"),
    Key("publication", p_nonempty, "", doc="publication whose tables are read; empty = capturer_<region name>"),
    Key("create_publication", p_create_publication, "no",
        doc="when the publication does not exist: no (an error), all (FOR ALL TABLES), or schema.table,..."),
    Key("heartbeat_ms", p_int(50, 60_000), 500, doc="idle heartbeat period"),
    Key("heartbeat_lag_ms", p_int(0, 600_000), 1000,
        doc="how far behind the server's clock a heartbeat promises"),
    Key("status_interval", p_float(0.1, 3600), 10.0, doc="seconds between status updates to the server"),
    Key("connect_timeout", p_float(0.5, 600), 10.0),
    Key("sslmode", p_choice("disable", "allow", "prefer", "require", "verify-ca", "verify-full"), "prefer"),
    Key("ddl", p_bool, True,
        doc="send MySQL DDL for new and changed tables (CREATE TABLE on first sight, ALTER TABLE, TRUNCATE)"),
    Key("toast_fill", p_bool, True,
        doc="read unchanged TOASTed values (absent from the log under REPLICA IDENTITY DEFAULT) from the table"),
    Key("toast_wait_ms", p_int(0, 600_000), 5000,
        doc="how long a TOAST fill waits for its transaction to become visible to other sessions (it can be "
            "delivered before: under load, or a synchronous standby) before it reads anyway"),
    *snapshot_keys("the published tables the filter selects", "when the checkpoint's changes are gone from the slot",
                   "read a table's next chunk on a second connection while the one before is delivered"),
    Key("process", p_bool, False,
        doc="read and decode this region in a worker process of its own (a local region agent) instead of "
            "the capturer's process"),
    Key("publication_check_s", p_float(0, 86_400), 10.0,
        doc="seconds between looks at the publication's tables: a table added to it (ALTER PUBLICATION ... ADD "
            "TABLE) that the filter selects is copied live as snapshotNewTables says; 0 = never look"),
]


def parse(ini: IniFile, section: str, name: str) -> PostgresRegionConfig:
    v = parse_section(ini, section, KEYS)
    default = "capturer_" + re.sub(r"[^a-z0-9_]", "_", name.lower())[:50]
    v["slot"] = v["slot"] or default
    v["publication"] = v["publication"] or default
    return PostgresRegionConfig(name=name, **{k: v[k] for k in v})


def claim(r: PostgresRegionConfig, ids: dict[Any, str], path: Path) -> None:
    """Refuses a second region that reads the same replication slot."""
    pkey = (r.host, r.port, r.dbname, r.slot)
    if pkey in ids:
        raise ConfigError(f"{path}: regions [region:{ids[pkey]}] and [region:{r.name}] read the same "
                          f"replication slot {r.slot!r} of {r.host}:{r.port}/{r.dbname}")
    ids[pkey] = r.name
