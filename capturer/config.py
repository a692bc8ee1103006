"""``conf/config.cfg`` and ``conf/senderConfig.cfg``: parsed once, validated, typed.

Any problem is a ``ConfigError`` naming file, line, section and key; the
process exits with code 2 and nothing starts.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from capturer import regions as regions_registry
from capturer.errors import ConfigError
from capturer.util import urlsecrets
from capturer.util.dotted import load
from capturer.util.ini import (
    IniFile,
    Key,
    p_choice,
    p_float,
    p_int,
    p_list,
    p_nonempty,
    p_str,
    parse_section,
    read_ini,
)

log = logging.getLogger(__name__)

_REGION_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


_PEER = re.compile(r"^[A-Za-z0-9_.\-\[\]:]+:\d{1,5}$")


def p_peers(v: str) -> tuple[str, ...]:
    peers = tuple(x.strip() for x in v.split(",") if x.strip())
    if not peers:
        raise ValueError("expected host:port[,host:port...]")
    for p in peers:
        if not _PEER.match(p) or not 0 < int(p.rsplit(":", 1)[1]) < 65536:
            raise ValueError(f"{p!r} is not host:port")
    return peers


def p_peers_or_empty(v: str) -> tuple[str, ...]:
    return p_peers(v) if v.strip() else ()


GLOBAL_KEYS = [
    Key("binlogCheckPointPath", p_nonempty, "./conf/binlog_checkpoint.txt",
        doc="checkpoint file (JSON), written atomically every checkpointInterval seconds"),
    Key("senderConfig", p_nonempty, "./conf/senderConfig.cfg", doc="sender config file"),
    Key("filterRuleDict", p_str, "./conf/filter_rule.txt",
        doc="filter rule file; empty value = no filter"),
    Key("httpPort", p_int(0, 65535), 8080, doc="status port; 0 = pick a free port, see the log"),
    Key("httpHost", p_nonempty, "127.0.0.1", doc="status bind address"),
    Key("httpAllowedHosts", p_list, [],
        doc="Host names, besides 127.0.0.1/localhost/[::1], that a loopback-bound status port answers to "
            "(e.g. a TLS proxy that passes its own Host)"),
    Key("checkpointInterval", p_float(0.1, 3600), 3.0, doc="seconds between checkpoints"),
    Key("queueRows", p_int(1, 10_000_000), 100_000,
        doc="bound on buffered rows per region queue, and on the rows of the merged stream kept in memory for "
            "the senders (a sender further behind reads the backlog on disk)"),
    Key("backlogDir", p_str, "",
        doc="directory of the backlog: the merged stream kept on disk for senders that fall behind; "
            "empty = <binlogCheckPointPath>.backlog next to the checkpoint"),
    Key("backlogMaxMB", p_int(0, 10_000_000), 4096,
        doc="bound on the backlog's size on disk; 0 = no backlog (a sender that falls behind holds the stream "
            "once queueRows are waiting for it)"),
    Key("backlogFull", p_choice("block", "detach"), "block",
        doc="when the backlog reaches backlogMaxMB: block = the stream waits for the sender furthest behind "
            "(nothing lost); detach = that sender is detached (shown, alerting, its position kept) and "
            "the others go on; it is attached again by an operator"),
    Key("logLevel", p_choice("debug", "info", "warning", "error"), "info", doc="log level"),
    Key("spillRows", p_int(0, 100_000_000), 50_000,
        doc="a transaction with more row changes than this is kept on disk, in chunks, not in memory; 0 = never"),
    Key("spillDir", p_str, "", doc="directory for spilled transactions (unlinked files); empty = the system's temp dir"),
    Key("snapshotNewTables", p_choice("truncate", "copy", "never"), "truncate",
        doc="tables a filter reload adds are copied while streaming, in every MySQL/MariaDB and PostgreSQL "
            "region that has them: truncate (each emptied downstream first, so rows left from an earlier "
            "inclusion go too), copy (upserted, nothing emptied), never (only their changes from then on)"),
    Key("controlToken", p_str, "", secret=True,
        doc="token that unlocks the control endpoints of the status port (pause/resume a sender, reload the filter, snapshot, stop); empty = they are off"),
]

def p_endpoints(v: str) -> tuple[str, ...]:
    """Coordination service endpoints: ``http://host:port`` (or ``host:port``), separated by commas."""
    out = []
    for x in p_list(v):
        m = re.fullmatch(r"(?:(https?)://)?(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+):(\d{1,5})/?", x)
        if not m or not 0 < int(m.group(3)) < 65536:
            raise ValueError(f"expected http://host:port, got {x!r}")
        out.append(f"{m.group(1) or 'http'}://{m.group(2)}:{int(m.group(3))}")
    if not out:
        raise ValueError("expected at least one endpoint (http://host:port)")
    return tuple(out)


def p_ha_name(v: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9_.-]{1,100}", v):
        raise ValueError("expected letters, digits, '_', '.' or '-' (it becomes part of the etcd keys)")
    return v


HA_KEYS = [
    Key("endpoints", p_endpoints, required=True,
        doc="etcd endpoints (http://host:port, comma-separated; every member of the cluster): with this section "
            "the capturer runs as one of an active/standby group"),
    Key("name", p_ha_name, "capturer",
        doc="the group's name: capturers with the same name (and etcd) share one lease and one checkpoint"),
    Key("leaseSeconds", p_int(2, 300), 10,
        doc="the active's lease in etcd: a standby takes over this long after the active stopped renewing it"),
    Key("id", p_str, "",
        doc="this capturer's name in the group (default: host name and status port, or host name and pid "
            "when httpPort=0); its local files live in <checkpoint dir>/ha-<id>/"),
]


@dataclass(frozen=True)
class HaConfig:
    endpoints: tuple[str, ...]
    name: str
    lease_seconds: int
    id: str






class AnyRegionConfig(Protocol):
    """A ``[region:NAME]`` section's typed config, whatever its kind (each kind's
    dataclass lives in its folder's ``keys.py``, made by the kind's ``parse``)."""

    @property
    def name(self) -> str: ...

    @property
    def type(self) -> str: ...

    def masked(self) -> dict[str, Any]: ...


@dataclass(frozen=True)
class SenderConfig:
    name: str
    options: dict[str, Any]
    path: Path
    secret: frozenset[str] = frozenset()  # option names whose values are never shown


class SenderCatalog(Protocol):
    """What the config loader needs to know of the senders: their names and the
    keys each one takes. The composition root (``capturer.app``) passes the sender
    registry; this module never imports a sender."""

    def names(self) -> Sequence[str]: ...

    def keys(self, name: str) -> Sequence[Key]: ...


@dataclass(frozen=True)
class AppConfig:
    path: Path
    checkpoint_path: Path
    sender_config_path: Path
    filter_path: Path | None
    http_host: str
    http_port: int
    checkpoint_interval: float
    queue_rows: int
    log_level: str
    regions: tuple[AnyRegionConfig, ...]
    senders: tuple[SenderConfig, ...]
    spill_rows: int = 50_000
    spill_dir: str = ""
    control_token: str = field(default="", repr=False)
    http_allowed_hosts: tuple[str, ...] = ()
    backlog_dir: Path | None = None  # None: <checkpoint>.backlog
    backlog_max_mb: int = 4096
    backlog_full: str = "block"
    ha: HaConfig | None = None  # [ha]: active/standby (capturer/ha); None = a single process
    snapshot_new_tables: str = "truncate"  # snapshotNewTables: truncate | copy | never

    @property
    def backlog_path(self) -> Path:
        return self.backlog_dir or self.checkpoint_path.with_name(self.checkpoint_path.name + ".backlog")

    def masked(self) -> dict[str, Any]:
        return {
            "config": str(self.path),
            "binlogCheckPointPath": str(self.checkpoint_path),
            "senderConfig": str(self.sender_config_path),
            "filterRuleDict": str(self.filter_path or ""),
            "http": f"{self.http_host}:{self.http_port}",
            "controlToken": "***" if self.control_token else "",
            "backlog": {"dir": str(self.backlog_path), "maxMB": self.backlog_max_mb, "full": self.backlog_full},
            "ha": None if self.ha is None else {"endpoints": list(self.ha.endpoints), "name": self.ha.name,
                                                "leaseSeconds": self.ha.lease_seconds, "id": self.ha.id},
            "regions": {r.name: r.masked() for r in self.regions},
            "senders": {s.name: {k: ("***" if k in s.secret and v else _url_shown(v)) for k, v in s.options.items()}
                        for s in self.senders},
        }


def _url_shown(v: Any) -> Any:
    """An option that is a URL, without its password and query values (a token there)."""
    if isinstance(v, str) and v.lower().startswith(("http://", "https://")):
        return urlsecrets.shown(v)
    return v


def _resolve(base: Path, value: str) -> Path:
    p = Path(value).expanduser()
    return p if p.is_absolute() else (base / p)


def load_config(path: Path | str, base_dir: Path | None = None, senders: SenderCatalog | None = None) -> AppConfig:
    """Parse and validate both config files. Relative paths are taken from
    ``base_dir`` (default: the current directory, as the seed did).

    ``senders`` is the sender catalog senderConfig is validated against; the
    capturer loads its config through ``capturer.app.load_config``, which passes
    the registry. Without a catalog (tools that need only the global and region
    settings: the CLI, the agent) the sender file is not read and ``senders`` of
    the result is empty, which the capturer refuses to start with."""
    path = Path(path)
    base = base_dir or Path.cwd()
    ini = read_ini(path)
    for name, sec in ini.sections.items():
        if name not in ("global", "ha") and not name.startswith("region:"):
            raise ConfigError(
                f"{path}:{sec.line}: unknown section [{name}]; expected [global], [region:NAME] or [ha]"
            )
    if "global" not in ini.sections:
        raise ConfigError(f"{path}: missing section [global]")
    g = parse_section(ini, "global", GLOBAL_KEYS)
    regions = parse_regions(ini, path)

    sender_path = _resolve(base, g["senderConfig"])
    sender_cfgs = load_sender_config(sender_path, senders) if senders is not None else ()
    filter_path = _resolve(base, g["filterRuleDict"]) if g["filterRuleDict"] else None
    return AppConfig(
        path=path,
        checkpoint_path=_resolve(base, g["binlogCheckPointPath"]),
        sender_config_path=sender_path,
        filter_path=filter_path,
        http_host=g["httpHost"],
        http_port=g["httpPort"],
        checkpoint_interval=g["checkpointInterval"],
        queue_rows=g["queueRows"],
        log_level=g["logLevel"],
        spill_rows=g["spillRows"],
        spill_dir=str(_resolve(base, g["spillDir"])) if g["spillDir"] else "",
        control_token=g["controlToken"],
        http_allowed_hosts=tuple(h.lower() for h in g["httpAllowedHosts"]),
        backlog_dir=_resolve(base, g["backlogDir"]) if g["backlogDir"] else None,
        backlog_max_mb=g["backlogMaxMB"],
        backlog_full=g["backlogFull"],
        snapshot_new_tables=g["snapshotNewTables"],
        regions=tuple(regions),
        senders=sender_cfgs,
        ha=_ha_config(ini) if "ha" in ini.sections else None,
    )


def _ha_config(ini: IniFile) -> HaConfig:
    h = parse_section(ini, "ha", HA_KEYS)
    return HaConfig(endpoints=h["endpoints"], name=h["name"], lease_seconds=h["leaseSeconds"], id=h["id"].strip())


def parse_regions(ini: IniFile, path: Path, allow_remote: bool = True) -> list[AnyRegionConfig]:
    """Every ``[region:NAME]`` section, validated by its ``type``; at least one. Two
    regions that read the same source are an error."""
    regions: list[AnyRegionConfig] = []
    for name, sec in ini.sections.items():
        if not name.startswith("region:"):
            continue
        rname = name[len("region:"):].strip()
        if not _REGION_NAME.match(rname):
            raise ConfigError(
                f"{path}:{sec.line}: region name {rname!r} must be 1-64 of A-Z a-z 0-9 _ . -"
            )
        given = sec.values.get("type")
        kind = given.value.lower() if given is not None else regions_registry.DEFAULT_TYPE
        if kind not in regions_registry.types(allow_remote):
            raise ConfigError(f"{ini.where(name, 'type')}: bad value {given.value if given else kind!r}: expected one "
                              f"of {', '.join(regions_registry.types(allow_remote))}")
        regions.append(load(regions_registry.kind(kind).parse)(ini, name, rname))
    if not regions:
        raise ConfigError(f"{path}: no [region:NAME] section; configure at least one source")
    ids: dict[Any, str] = {}
    for r in regions:
        load(regions_registry.kind(r.type).claim)(r, ids, path)

    return regions


def load_sender_config(path: Path, catalog: SenderCatalog) -> tuple[SenderConfig, ...]:
    ini: IniFile = read_ini(path)
    if "global" not in ini.sections:
        raise ConfigError(f"{path}: missing section [global] with type=...")
    g = parse_section(ini, "global", [Key("type", p_list, required=True)])
    names: list[str] = g["type"]
    if not names:
        raise ConfigError(f"{ini.where('global', 'type')}: type lists no sender")
    known = sorted(catalog.names())
    for n in names:
        if n not in known:
            raise ConfigError(
                f"{ini.where('global', 'type')}: unknown sender {n!r}; known: {', '.join(known)}"
            )
    if len(set(names)) != len(names):
        raise ConfigError(f"{ini.where('global', 'type')}: a sender is listed twice")
    for name, sec in ini.sections.items():
        if name != "global" and name not in known:
            raise ConfigError(
                f"{path}:{sec.line}: unknown section [{name}]; known: global, {', '.join(known)}"
            )
    out = []
    for n in names:
        keys = list(catalog.keys(n))
        opts = parse_section(ini, n, keys)
        check = getattr(catalog, "check", None)  # a sender's checks across its keys (senders/__init__.py)
        if check is not None:
            check(n, opts, lambda key, _n=n: ini.where(_n, key))
        out.append(SenderConfig(n, opts, path, frozenset(k.name for k in keys if k.secret)))
    # sections of senders not in type= are validated too, so a typo is found now
    for name in ini.sections:
        if name != "global" and name not in names:
            parse_section(ini, name, list(catalog.keys(name)))
    return tuple(out)
