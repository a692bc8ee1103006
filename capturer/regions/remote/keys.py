"""The ``[region:NAME]`` keys of ``type = remote`` (a region served by a region
agent) and the section's parsing (capturer/config.py reaches them through the region
registry)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from capturer.config import p_peers
from capturer.errors import ConfigError
from capturer.util.ini import IniFile, Key, p_bool, p_choice, p_float, p_str, parse_section


@dataclass(frozen=True)
class RemoteRegionConfig:
    name: str
    type: str
    address: tuple[str, ...]
    agent_region: str = ""
    token: str = field(default="", repr=False)
    tls: bool = False
    tls_ca: str = ""
    tls_cert: str = ""
    tls_key: str = ""
    tls_server_name: str = ""
    connect_timeout: float = 5.0
    idle_timeout: float = 15.0

    @property
    def remote_name(self) -> str:
        return self.agent_region or self.name

    @property
    def uses_tls(self) -> bool:
        return self.tls or bool(self.tls_ca or self.tls_cert)

    def masked(self) -> dict[str, Any]:
        return {"type": self.type, "address": ",".join(self.address), "agent_region": self.remote_name,
                "token": "***" if self.token else "", "tls": self.uses_tls}

KEYS = [
    Key("type", p_choice("remote"), "remote", doc="region kind: a region served by a region agent"),
    Key("address", p_peers, required=True,
        doc="the agent: host:port; several (comma-separated) are tried in turn (an agent moved or restarted elsewhere)"),
    Key("agent_region", p_str, "", doc="the region's name in the agent's config; empty = this section's name"),
    Key("token", p_str, "", secret=True, doc="shared token the agent requires (its [agent] token)"),
    Key("tls", p_bool, False, doc="connect with TLS (set automatically when tls_ca is given)"),
    Key("tls_ca", p_str, "", doc="PEM file of the CA that signed the agent's certificate; empty = the system's roots"),
    Key("tls_cert", p_str, "", doc="PEM client certificate, for agents that require one (tls_client_ca)"),
    Key("tls_key", p_str, "", doc="PEM key of tls_cert"),
    Key("tls_server_name", p_str, "", doc="name to check in the agent's certificate instead of the address's host"),
    Key("connect_timeout", p_float(0.1, 600), 5.0, doc="seconds to reach an agent before trying the next address"),
    Key("idle_timeout", p_float(1, 3600), 15.0,
        doc="an agent that sends nothing for this long (it sends a status every second) is given up and reconnected"),
]


def parse(ini: IniFile, section: str, name: str) -> RemoteRegionConfig:
    v = parse_section(ini, section, KEYS)
    if bool(v["tls_cert"]) != bool(v["tls_key"]):
        raise ConfigError(f"{ini.where(section, 'tls_cert' if v['tls_cert'] else 'tls_key')}: "
                          "tls_cert and tls_key go together (a client certificate for mutual TLS)")
    for k in ("tls_ca", "tls_cert", "tls_key"):
        if v[k] and not Path(v[k]).expanduser().is_file():
            raise ConfigError(f"{ini.where(section, k)}: no such file: {v[k]}")
    return RemoteRegionConfig(name=name, **{k: v[k] for k in v})


def claim(r: RemoteRegionConfig, ids: dict[Any, str], path: Path) -> None:
    """Refuses a second region that subscribes to the same agent region."""
    for addr in r.address:
        rkey = (addr, r.agent_region or r.name)
        if rkey in ids:
            raise ConfigError(
                f"{path}: regions [region:{ids[rkey]}] and [region:{r.name}] both subscribe to region "
                f"{rkey[1]!r} of the agent at {addr}")
        ids[rkey] = r.name
