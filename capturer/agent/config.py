"""``conf/agent.cfg``: an ``[agent]`` section and the ``[region:NAME]`` sections it
serves (the same keys as in ``config.cfg``; remote regions cannot be served again)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, cast

from capturer.config import AnyRegionConfig, _resolve, load_config, parse_regions
from capturer.errors import ConfigError
from capturer.regions import kind as region_kind
from capturer.util.ini import Key, p_choice, p_float, p_int, p_nonempty, p_str, parse_section, read_ini

_LISTEN = re.compile(r"^(unix:.+|[A-Za-z0-9_.\-\[\]:]+:\d{1,5})$")


def p_listen(v: str) -> str:
    if not _LISTEN.match(v) or (not v.startswith("unix:") and not 0 <= int(v.rsplit(":", 1)[1]) < 65536):
        raise ValueError("expected host:port (port 0 = any free port) or unix:PATH")
    return v


AGENT_KEYS = [
    Key("listen", p_listen, "127.0.0.1:9191",
        doc="host:port to serve on (0.0.0.0 for every interface: then set a token and TLS), or unix:PATH"),
    Key("token", p_str, "", secret=True, doc="capturers must send this token (their region's token=); empty = none"),
    Key("tls_cert", p_str, "", doc="PEM certificate to serve TLS with (with tls_key)"),
    Key("tls_key", p_str, "", doc="PEM key of tls_cert"),
    Key("tls_client_ca", p_str, "", doc="PEM CA: capturers must present a certificate it signed (mutual TLS)"),
    Key("stateDir", p_nonempty, "./agent-state",
        doc="where regions keep the few files they need (a BaikalDB region's schema journal)"),
    Key("queueRows", p_int(1, 10_000_000), 100_000, doc="bound on buffered rows per served region"),
    Key("spillRows", p_int(0, 100_000_000), 50_000, doc="a bigger transaction is kept on disk; 0 = never"),
    Key("spillDir", p_str, "", doc="directory for spilled transactions; empty = the system's temp dir"),
    Key("statusInterval", p_float(0.1, 60), 1.0, doc="seconds between status messages on an idle stream"),
    Key("logLevel", p_choice("debug", "info", "warning", "error"), "info"),
]


@dataclass(frozen=True)
class AgentConfig:
    path: Path
    listen: str
    state_dir: Path
    regions: tuple[AnyRegionConfig, ...]
    token: str = field(default="", repr=False)
    tls_cert: str = ""
    tls_key: str = ""
    tls_client_ca: str = ""
    queue_rows: int = 100_000
    spill_rows: int = 50_000
    spill_dir: str = ""
    status_interval: float = 1.0
    log_level: str = "info"
    state_path: Path | None = None  # where a region keeps state files (default: stateDir/agent)

    def masked(self) -> dict[str, Any]:
        return {"config": str(self.path), "listen": self.listen, "token": "***" if self.token else "",
                "tls": bool(self.tls_cert), "mutual_tls": bool(self.tls_client_ca), "stateDir": str(self.state_dir),
                "regions": {r.name: r.masked() for r in self.regions}}


def _in_process(r: AnyRegionConfig) -> AnyRegionConfig:
    """The region as an agent serves it: read in the agent's own process (every local
    kind's config is a dataclass with ``process``)."""
    out: AnyRegionConfig = replace(cast(Any, r), process=False)
    return out


def worker_config(capturer_config: Path, region: str, listen: str) -> AgentConfig:
    """An agent serving one region of a capturer's own config (``process = true``):
    the capturer's queue and spill settings, its state files where the in-process
    region would keep them (next to the checkpoint)."""

    cfg = load_config(capturer_config)
    rcfg = next((r for r in cfg.regions if r.name == region), None)
    if rcfg is None or region_kind(rcfg.type).agent:  # type=remote
        raise ConfigError(f"{capturer_config}: no local region [region:{region}]")
    return AgentConfig(path=capturer_config, listen=p_listen(listen), state_dir=cfg.checkpoint_path.parent,
                       regions=(_in_process(rcfg),), queue_rows=cfg.queue_rows, spill_rows=cfg.spill_rows,
                       spill_dir=cfg.spill_dir, status_interval=1.0, log_level=cfg.log_level,
                       state_path=cfg.checkpoint_path)


def load_agent_config(path: Path | str, base_dir: Path | None = None) -> AgentConfig:
    path = Path(path)
    base = base_dir or Path.cwd()
    ini = read_ini(path)
    for name, sec in ini.sections.items():
        if name != "agent" and not name.startswith("region:"):
            raise ConfigError(f"{path}:{sec.line}: unknown section [{name}]; expected [agent] or [region:NAME]")
    if "agent" not in ini.sections:
        raise ConfigError(f"{path}: missing section [agent]")
    g = parse_section(ini, "agent", AGENT_KEYS)
    if bool(g["tls_cert"]) != bool(g["tls_key"]):
        raise ConfigError(f"{ini.where('agent', 'tls_cert' if g['tls_cert'] else 'tls_key')}: "
                          "tls_cert and tls_key go together")
    if g["tls_client_ca"] and not g["tls_cert"]:
        raise ConfigError(f"{ini.where('agent', 'tls_client_ca')}: mutual TLS needs tls_cert and tls_key too")
    for k in ("tls_cert", "tls_key", "tls_client_ca"):
        if g[k] and not _resolve(base, g[k]).is_file():
            raise ConfigError(f"{ini.where('agent', k)}: no such file: {_resolve(base, g[k])}")
    # (no remote regions: allow_remote=False)
    regions = [_in_process(r) for r in parse_regions(ini, path, allow_remote=False)
               if not region_kind(r.type).agent]
    return AgentConfig(
        path=path, listen=g["listen"], state_dir=_resolve(base, g["stateDir"]), regions=tuple(regions),
        token=g["token"],
        tls_cert=str(_resolve(base, g["tls_cert"])) if g["tls_cert"] else "",
        tls_key=str(_resolve(base, g["tls_key"])) if g["tls_key"] else "",
        tls_client_ca=str(_resolve(base, g["tls_client_ca"])) if g["tls_client_ca"] else "",
        queue_rows=g["queueRows"], spill_rows=g["spillRows"],
        spill_dir=str(_resolve(base, g["spillDir"])) if g["spillDir"] else "",
        status_interval=g["statusInterval"], log_level=g["logLevel"])
