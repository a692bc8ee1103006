"""``--check [--connect]`` of a region served by a region agent: the TLS files the
section names, and the agent answering with the region's name and the token."""

from __future__ import annotations

import ssl
from pathlib import Path

from capturer.errors import SourceError
from capturer.util.probe import Outcome, Probe, RegionCheck, unreadable


def probe(c: RegionCheck) -> Probe:
    rc = c.config
    return Probe(f"region {rc.name} (agent {','.join(rc.address)})", lambda out: _source(c, out),
                 f"check address, token, agent_region and the TLS settings in {c.section}")


def _source(c: RegionCheck, out: Outcome) -> None:
    region, rc = c.region, c.config
    # the request a capturer makes before a snapshot: the agent checks the token and the
    # region's name; with no table asked, it does not reach for its source
    try:
        region.tables_info([])
    except SourceError as exc:
        raise SourceError(f"region {rc.name} (agent {','.join(rc.address)}): no agent answered: "
                          + str(exc).split(" (", 1)[-1].removesuffix(")")) from None
    out.detail = f"the agent serves region {rc.remote_name!r}" + (" over TLS" if rc.uses_tls else "")


def offline(c: RegionCheck) -> list[str]:
    """The TLS files the section names: readable, and loadable as PEM."""
    rc = c.config
    out = []
    for key in ("tls_ca", "tls_cert", "tls_key"):
        value = getattr(rc, key)
        if value:
            why = unreadable(Path(value).expanduser())
            if why:
                out.append(f"{c.at(key)} = {value}: {why}")
    if out:
        return out
    try:
        if rc.tls_ca:
            ssl.create_default_context(cafile=str(Path(rc.tls_ca).expanduser()))
    except (ssl.SSLError, ValueError) as exc:
        out.append(f"{c.at('tls_ca')} = {rc.tls_ca}: not a PEM CA certificate ({exc})")
    try:
        if rc.tls_cert:
            ssl.create_default_context().load_cert_chain(str(Path(rc.tls_cert).expanduser()),
                                                         str(Path(rc.tls_key).expanduser()))
    except (ssl.SSLError, ValueError) as exc:
        out.append(f"{c.at('tls_cert')} = {rc.tls_cert} with tls_key = {rc.tls_key}: not a "
                   f"PEM certificate and its key ({exc})")
    return out
