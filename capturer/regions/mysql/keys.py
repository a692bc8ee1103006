"""The ``[region:NAME]`` keys of ``type = mysql`` / ``mariadb`` and the section's
parsing (capturer/config.py reaches them through the region registry)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from capturer.config import p_peers_or_empty
from capturer.errors import ConfigError
from capturer.regions.snapshot_keys import snapshot_keys
from capturer.util.ini import IniFile, Key, p_bool, p_choice, p_float, p_int, p_nonempty, p_str, parse_section
from capturer.util.mysqlconn import SSL_KEYS, check_ssl_keys, tls_kwargs


@dataclass(frozen=True)
class RegionConfig:
    name: str
    type: str
    host: str
    port: int
    user: str
    password: str = field(repr=False)
    server_id: int
    start: str = "earliest"
    replicas: tuple[str, ...] = ()
    heartbeat_ms: int = 500
    heartbeat_lag_ms: int = 1000
    connect_timeout: float = 10.0
    ssl_mode: str = "preferred"
    ssl_ca: str = ""
    ssl_cert: str = ""
    ssl_key: str = ""
    decoder: str = "fast"
    snapshot: str = "never"
    snapshot_method: str = "auto"
    snapshot_workers: int = 2
    snapshot_chunk_rows: int = 20_000
    snapshot_read_ahead: bool = False
    snapshot_ddl: bool = True
    snapshot_driver: str = "auto"
    process: bool = False

    def masked(self) -> dict[str, Any]:
        return {
            "type": self.type, "host": self.host, "port": self.port, "user": self.user,
            "password": "***" if self.password else "", "server_id": self.server_id,
            "replicas": ",".join(self.replicas), "start": self.start, "heartbeat_ms": self.heartbeat_ms,
            "heartbeat_lag_ms": self.heartbeat_lag_ms, "snapshot": self.snapshot, "ssl_mode": self.ssl_mode,
        }

    def tls(self) -> dict[str, Any]:
        """pymysql's TLS arguments for this source."""
        return tls_kwargs(self.ssl_mode, self.ssl_ca, self.ssl_cert, self.ssl_key)

_START = re.compile(r"^(earliest|latest|[^:\s]+:\d+)$")


def p_start(v: str) -> str:
    if not _START.match(v):
        raise ValueError("expected earliest, latest or BINLOG_FILE:POS (e.g. mariadb-bin.000001:4)")
    return v


KEYS = [
    Key("type", p_choice("mysql", "mariadb"), "mysql", doc="region kind"),
    Key("host", p_nonempty, required=True),
    Key("port", p_int(1, 65535), 3306),
    Key("replicas", p_peers_or_empty, (),
        doc="the source's other servers, host:port[,host:port...]: when host is unreachable or no longer the "
            "primary (read_only=ON), the region reads the one of them that is (failover, resumed from the GTID "
            "position; see docs/regions-mysql.md#failover)"),
    Key("user", p_nonempty, required=True),
    Key("password", p_str, "", secret=True),
    Key("server_id", p_int(1, 4294967295), required=True,
        doc="replica server id this capturer uses; unique among the source's replicas"),
    Key("start", p_start, "earliest",
        doc="where to start without a checkpoint: earliest, latest, or FILE:POS"),
    Key("heartbeat_ms", p_int(50, 60_000), 500, doc="idle heartbeat period"),
    Key("heartbeat_lag_ms", p_int(0, 600_000), 1000,
        doc="how far behind the source clock an idle heartbeat promises"),
    Key("connect_timeout", p_float(0.5, 600), 10.0),
    *SSL_KEYS,
    Key("decoder", p_choice("fast", "library"), "fast",
        doc="row decoder: fast (planned per table) or library (python-mysql-replication)"),
    *snapshot_keys("the selected tables", "when the checkpoint's binlog is purged",
                   "read a table's next chunk on a second connection while the one before is delivered (a worker "
                   "then holds two chunks): pays where the source is slow to answer; against a local server the "
                   "capturer's own work bounds the copy and the second reader only costs (see docs/benchmarks.md)"),
    Key("snapshot_method", p_choice("auto", "consistent", "watermark"), "auto",
        doc="how a chunk is made consistent with the binlog: consistent (MariaDB's consistent-snapshot position), "
            "watermark (a locking read per chunk and the binlog position read while its locks are held: MySQL "
            "5.7/8.x), auto (consistent where the server reports that position, else watermark)"),
    Key("snapshot_driver", p_choice("auto", "mariadb", "pymysql"), "auto",
        doc="client that reads snapshot chunks: MariaDB Connector/Python where installed (auto), or pymysql"),
    Key("snapshot_ddl", p_bool, True,
        doc="send CREATE DATABASE/TABLE IF NOT EXISTS (from SHOW CREATE TABLE) before a table's copy starts"),
    Key("process", p_bool, False,
        doc="read and decode this region in a worker process of its own (a local region agent) instead of "
            "the capturer's process: decoding then uses another core and not the senders' GIL"),
]


def parse(ini: IniFile, section: str, name: str) -> RegionConfig:
    v = parse_section(ini, section, KEYS)
    check_ssl_keys(ini, section, v)
    return RegionConfig(name=name, **{k: v[k] for k in v})


def claim(r: RegionConfig, ids: dict[Any, str], path: Path) -> None:
    """Refuses a second region that reads the same server: its ``host`` or one of its
    ``replicas`` (after a failover the two would read one source twice)."""
    servers = [(r.host.lower(), int(r.port), "host")]
    for peer in r.replicas:
        h, _, p = peer.rpartition(":")
        servers.append((h.lower(), int(p), "replicas"))
    for host, port, key in servers:
        other = ids.get((host, port))
        if other is not None and other != r.name:
            raise ConfigError(
                f"{path}: regions [region:{other}] and [region:{r.name}] read the same server {host}:{port} "
                f"([region:{r.name}] {key}; a server is the host or one of the replicas of one region only: two "
                "regions would read its binlog twice, the second after a failover)")
        ids[(host, port)] = r.name
