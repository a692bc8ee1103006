"""The coordination service: etcd, over its HTTP/JSON gateway (``/v3/...``, the API etcd3gw
speaks), with ``requests``. A client of its own, not etcd3gw's: one etcd3gw client talks to
one endpoint, and this one needs to go to the next cluster member when one is down, to
compare the leader key's create_revision in every write, and to time each lease renewal
from before its request was sent.

Keys, under ``/binlog-capturer/<name>/``:

* ``leader``: the active capturer (JSON: id, host, status port, pid, since),
  attached to its lease. Created only if absent (a transaction comparing its
  create_revision with 0): of capturers campaigning at once exactly one wins.
  The **epoch** (fencing token) is that key's create_revision: etcd's revision
  only grows, so every new leader key has a greater one.
* ``state``: the active's state (checkpoint and its side files, zlib JSON),
  written by a transaction that compares ``leader``'s create_revision with the
  writer's epoch: a deposed capturer's write fails (``Fenced``).
* ``takeovers``: the last takeovers (JSON list), written the same way.
* ``members/<id>``: every running capturer (role, status port), on its own lease.

Every call tries the endpoints in turn (a cluster member down: the next one);
``CoordinationError`` when none answers.
"""

from __future__ import annotations

import base64
import json
import logging
import time
import zlib
from typing import Any

from capturer.errors import CapturerError, Fenced

log = logging.getLogger(__name__)


class CoordinationError(CapturerError):
    """etcd did not answer (every endpoint), or answered an error."""


class CoordinationRefused(CoordinationError):
    """etcd answered, and refused the request (too large, space quota reached, ...): trying
    again the same way does not help."""


def _b64(v: str | bytes) -> str:
    return base64.b64encode(v.encode() if isinstance(v, str) else v).decode()


def _unb64(v: str) -> bytes:
    return base64.b64decode(v)


class Coordinator:
    def __init__(self, endpoints: tuple[str, ...], name: str, lease_seconds: int, timeout: float | None = None):
        import requests

        self.endpoints = list(endpoints)
        self.prefix = f"/binlog-capturer/{name}/"
        self.ttl = lease_seconds
        self.timeout = timeout or max(1.0, min(5.0, lease_seconds / 3))
        self._session = requests.Session()
        self._current = 0  # the endpoint that answered last
        self.lease_id = 0  # the leader lease (while active)
        self.epoch = 0
        self.member_lease = 0
        self.calls = 0
        self.failovers = 0
        self.revision = 0  # the highest store revision an answer carried
        self._registered: dict[str, Any] | None = None

    # --- transport ------------------------------------------------------------
    def _post(self, path: str, payload: dict[str, Any]) -> dict[str, Any]:
        import requests

        errors = []
        for i in range(len(self.endpoints)):
            k = (self._current + i) % len(self.endpoints)
            url = f"{self.endpoints[k]}/v3/{path}"
            try:
                r = self._session.post(url, data=json.dumps(payload), timeout=self.timeout)
            except requests.RequestException as exc:
                errors.append(f"{self.endpoints[k]}: {type(exc).__name__}")
                continue
            if r.status_code != 200:
                # a member without a leader (its cluster lost quorum) answers 503: try another one
                errors.append(f"{self.endpoints[k]}: HTTP {r.status_code} {r.text[:200]}")
                if r.status_code >= 500 and "quota" not in r.text and "too large" not in r.text:
                    continue
                raise CoordinationRefused(f"etcd {path}: {errors[-1]}")
            try:
                out: dict[str, Any] = r.json()
            except ValueError:
                errors.append(f"{self.endpoints[k]}: not JSON: {r.text[:200]!r}")
                continue
            if k != self._current:
                self.failovers += 1
                log.info("etcd: now using %s", self.endpoints[k])
            self._current = k
            self.calls += 1
            self.revision = max(self.revision, int((out.get("header") or {}).get("revision", 0) or 0))
            return out
        raise CoordinationError(f"etcd {path}: no endpoint answered ({'; '.join(errors)})")

    def key(self, name: str) -> str:
        return self.prefix + name

    # --- reading --------------------------------------------------------------
    def get(self, name: str) -> tuple[bytes, int] | None:
        """The value and create_revision of a key, or None."""
        r = self._post("kv/range", {"key": _b64(self.key(name))})
        kvs = r.get("kvs") or []
        if not kvs:
            return None
        return _unb64(kvs[0].get("value", "")), int(kvs[0].get("create_revision", 0))

    def leader(self) -> tuple[dict[str, Any], int] | None:
        """The active capturer's record and epoch, or None (no active one)."""
        got = self.get("leader")
        if got is None:
            return None
        try:
            rec = json.loads(got[0])
        except ValueError:
            rec = {"id": got[0].decode(errors="replace")}
        return rec, got[1]

    def get_prefix(self, name: str) -> dict[str, bytes]:
        """Every key starting with ``name`` (names relative to the group's prefix) and its value."""
        p = self.key(name)
        end = p[:-1] + chr(ord(p[-1]) + 1)
        r = self._post("kv/range", {"key": _b64(p), "range_end": _b64(end)})
        return {_unb64(kv["key"]).decode()[len(self.prefix):]: _unb64(kv.get("value", "")) for kv in r.get("kvs") or []}

    def members(self) -> list[dict[str, Any]]:
        out = []
        for v in self.get_prefix("members/").values():
            try:
                out.append(json.loads(v))
            except ValueError:
                continue
        return out

    # --- the lease --------------------------------------------------------------
    def grant(self) -> tuple[int, float]:
        """A new lease: its id and the monotonic time (taken before asking) it surely lasts until."""
        t0 = time.monotonic()
        r = self._post("lease/grant", {"TTL": self.ttl})
        return int(r["ID"]), t0 + int(r.get("TTL", self.ttl))

    def refresh(self, lease_id: int) -> float | None:
        """Keep a lease alive: until when (monotonic) it surely lasts, or None if it expired."""
        t0 = time.monotonic()
        r = self._post("lease/keepalive", {"ID": lease_id})
        ttl = int((r.get("result") or {}).get("TTL", -1))
        return t0 + ttl if ttl > 0 else None

    def revoke(self, lease_id: int) -> None:
        self._post("kv/lease/revoke", {"ID": lease_id})

    def campaign(self, record: dict[str, Any]) -> tuple[int, float] | None:
        """Try to become the active one: (epoch, lease valid until) or None (another is)."""
        lease, until = self.grant()
        k = _b64(self.key("leader"))
        r = self._post("kv/txn", {
            "compare": [{"key": k, "result": "EQUAL", "target": "CREATE", "create_revision": 0}],
            "success": [{"request_put": {"key": k, "value": _b64(json.dumps(record)), "lease": lease}}],
            "failure": [],
        })
        if not r.get("succeeded"):
            try:
                self.revoke(lease)
            except CoordinationError:
                pass  # it expires by itself
            return None
        self.lease_id = lease
        self.epoch = int(r["header"]["revision"])  # the leader key's create_revision
        return self.epoch, until

    def put_fenced(self, items: dict[str, bytes]) -> None:
        """Write keys only while this capturer's leader key is there (its epoch): Fenced if not."""
        lk = _b64(self.key("leader"))
        r = self._post("kv/txn", {
            "compare": [{"key": lk, "result": "EQUAL", "target": "CREATE", "create_revision": self.epoch}],
            "success": [{"request_put": {"key": _b64(self.key(n)), "value": _b64(v)}} for n, v in items.items()],
            "failure": [],
        })
        if not r.get("succeeded"):
            raise Fenced(f"etcd {', '.join(items)}: not written: the leader key is no longer this capturer's "
                         f"(epoch {self.epoch}): another capturer took over")

    def resign(self) -> None:
        """Give the lease up now (the leader key goes with it): a standby takes over at once."""
        if self.lease_id:
            self.revoke(self.lease_id)
            self.lease_id = 0

    def register(self, ident: str, record: dict[str, Any]) -> None:
        """This capturer in ``members/`` (on a lease of its own, refreshed here; the key is
        written again only when the record changed or the lease was lost: every write is a
        revision etcd keeps until it is compacted)."""
        if self.member_lease and self.refresh(self.member_lease) is None:
            self.member_lease = 0
        if not self.member_lease:
            self.member_lease, _ = self.grant()
            self._registered = None
        if record != self._registered:
            self._post("kv/put", {"key": _b64(self.key(f"members/{ident}")), "value": _b64(json.dumps(record)),
                                  "lease": self.member_lease})
            self._registered = dict(record)

    def compact(self, revision: int) -> None:
        """Drop the history before ``revision`` (the state is rewritten every few seconds:
        without compaction etcd grows until its space quota refuses every write)."""
        if revision > 0:
            self._post("kv/compaction", {"revision": revision, "physical": False})

    def unregister(self) -> None:
        if self.member_lease:
            try:
                self.revoke(self.member_lease)
            except CoordinationError:
                pass
            self.member_lease = 0


def pack_state(d: dict[str, Any]) -> bytes:
    return zlib.compress(json.dumps(d, separators=(",", ":")).encode(), 6)


def unpack_state(raw: bytes) -> dict[str, Any]:
    try:
        d = json.loads(zlib.decompress(raw))
    except (zlib.error, ValueError) as exc:
        raise CoordinationError(f"the state in etcd cannot be read ({exc})") from None
    if not isinstance(d, dict):
        raise CoordinationError("the state in etcd is not a JSON object")
    return d
