"""High availability without a server: the lease guard every writer checks, the [ha]
section of the config, a journal's entries handed to etcd before they are used, and a
sender that refuses to write once the lease is gone (tests/integration/test_ha.py runs
the real thing against etcd)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from capturer.errors import ConfigError, Fenced
from capturer.model import Position, RowChange, TableSchema, Txn
from capturer.regions import journal
from capturer.regions.clock import LiftJournal
from capturer.util.fencing import LeaseGuard
from senders.base import Sender
from senders.local.sender import LocalSender
from tests.unit.test_config import BASE, write


def test_the_guard_refuses_once_the_lease_ran_out_or_was_lost() -> None:
    g = LeaseGuard()
    g.check("anyone")  # not armed (no [ha]): nothing is checked
    g.arm(7, time.monotonic() + 0.3)
    g.check("sender x")
    time.sleep(0.35)
    with pytest.raises(Fenced) as ei:
        g.check("sender x")
    assert "epoch 7" in str(ei.value) and "sender x" in str(ei.value) and not ei.value.retriable
    g.extend(time.monotonic() + 10)  # a renewal that comes too late does not bring it back
    with pytest.raises(Fenced):
        g.check("sender x")
    g.arm(8, time.monotonic() + 10)
    g.check("sender x")
    g.lose("etcd says its lease expired")
    with pytest.raises(Fenced) as ei:
        g.check("checkpoint")
    assert "etcd says its lease expired" in str(ei.value)
    g.disarm()
    g.check("checkpoint")


def test_ha_section(tmp_path: Path) -> None:
    from capturer.app import load_config

    cfg = load_config(write(tmp_path, BASE + "[ha]\nendpoints=10.0.0.1:2379, http://[::1]:2380/\nname=shop-1\n"), tmp_path)
    assert cfg.ha is not None and cfg.ha.endpoints == ("http://10.0.0.1:2379", "http://[::1]:2380")
    assert cfg.ha.name == "shop-1" and cfg.ha.lease_seconds == 10 and cfg.ha.id == ""
    assert cfg.masked()["ha"]["endpoints"] == ["http://10.0.0.1:2379", "http://[::1]:2380"]
    assert load_config(write(tmp_path, BASE), tmp_path).ha is None
    for body, needle in [("endpoints=etcd\n", "expected http://host:port"),
                         ("endpoints=h:1\nleaseSeconds=1\n", "leaseSeconds"),
                         ("endpoints=h:1\nname=a/b\n", "name"),
                         ("endpoints=h:1\nttl=3\n", "unknown key 'ttl'"),
                         ("name=x\n", "missing required key 'endpoints'")]:
        with pytest.raises(ConfigError) as ei:
            load_config(write(tmp_path, BASE + "[ha]\n" + body), tmp_path)
        assert needle in str(ei.value) and "config.cfg" in str(ei.value), (body, str(ei.value))


def test_a_journal_entry_is_replicated_before_put_returns(tmp_path: Path, monkeypatch: Any) -> None:
    seen: list[tuple[str, list[str]]] = []
    monkeypatch.setattr(journal, "REPLICATE", lambda path, lines: seen.append((path.name, lines)))
    j = LiftJournal(tmp_path / "cp.json.lifts")
    assert j.put(("r1", "bin.000001", 120), 99)
    assert seen == [("cp.json.lifts", ['{"region": "r1", "file": "bin.000001", "pos": 120, "commit_ts": 99}'])]
    assert not j.put(("r1", "bin.000001", 120), 99)  # nothing new: nothing sent
    assert j.put(("r1", "bin.000001", 180), 130)
    assert len(seen) == 2 and len(seen[1][1]) == 2

    def down(path: Path, lines: list[str]) -> None:
        raise Fenced("journal: not written: another capturer took over")

    monkeypatch.setattr(journal, "REPLICATE", down)
    with pytest.raises(Fenced):  # the region stops: the item that needs the lift does not leave it
        j.put(("r1", "bin.000001", 200), 140)


class Counting(Sender):
    def __init__(self) -> None:
        super().__init__("counting", {})
        self.sent = 0

    def send(self, batch: list[Txn]) -> None:
        self.sent += len(batch)


def _txn(ts: int) -> Txn:
    s = TableSchema("d", "t", ("id",), ("id",))
    return Txn("r", ts, Position("bin.000001", ts), (RowChange(s, "insert", None, (ts,)),))


def test_a_sender_writes_nothing_once_the_lease_is_gone(monkeypatch: Any) -> None:
    from capturer.util import fencing

    g = LeaseGuard()
    monkeypatch.setattr(fencing, "GUARD", g)
    s = Counting()
    g.arm(3, time.monotonic() + 30)
    s._send_once_more([_txn(1)], [True])
    assert s.sent == 1
    g.lose("the leader key is another capturer's")
    with pytest.raises(Fenced):
        s._send_once_more([_txn(2)], [True])
    assert s.sent == 1


def test_the_file_sender_has_one_writer(tmp_path: Path) -> None:
    from capturer.errors import SinkError

    opts = {"filepath": str(tmp_path / "out.jsonl"), "format": "json", "rotate_mb": 256, "fsync": False}
    a, b = LocalSender("local", dict(opts)), LocalSender("local", dict(opts))
    a.open()
    with pytest.raises(SinkError) as ei:
        b.open()
    assert ei.value.retriable and "another process" in str(ei.value) and "out.jsonl" in str(ei.value)
    a.close()
    b.open()  # once the first one is closed (or its process gone)
    b.close()


class FakeCoord:
    """What ``HaNode._restore`` reads of etcd: the state and the journal keys."""

    def __init__(self, state: bytes | None, journals: dict[str, bytes]):
        self.state, self.journals = state, journals
        self.endpoints = ["http://x:1"]
        self._current = 0
        self.failovers = 0

    def get(self, name: str) -> tuple[bytes, int] | None:
        return (self.state, 5) if name == "state" and self.state is not None else None

    def get_prefix(self, name: str) -> dict[str, bytes]:
        return {k: v for k, v in self.journals.items() if k.startswith(name)}


def test_a_takeover_rebuilds_the_local_files_from_etcd(tmp_path: Path) -> None:
    import json
    import threading
    import zlib

    from capturer.app import Capturer, load_config
    from capturer.ha.coord import pack_state
    from capturer.ha.node import HaNode
    from capturer.ops.status import StatusServer

    cfg = load_config(write(tmp_path, BASE + "[ha]\nendpoints=127.0.0.1:1\nid=node/a\n"), tmp_path)
    node = HaNode(cfg, [], threading.Event(), Capturer, StatusServer)
    node.epoch = 42
    old = '{"region": "a", "file": "bin.000001", "pos": 4, "commit_ts": 7}'
    new = '{"region": "a", "file": "bin.000001", "pos": 9, "commit_ts": 8}'
    cp = {"version": 2, "commit_ts": 5, "regions": {}, "region_ts": {}, "senders": {}}
    state = pack_state({"version": 1, "checkpoint": cp, "files": {".lifts": old + "\n", ".paused": "local\n"},
                        "epoch": 41, "holder": "b"})
    # a lift journalled after that checkpoint reached etcd by itself (journal.REPLICATE)
    node.coord = FakeCoord(state, {"journal.lifts": zlib.compress((old + "\n" + new + "\n").encode())})  # type: ignore[assignment]
    (tmp_path / "ha-node_a").mkdir()
    (tmp_path / "ha-node_a" / "stale.backlog").write_text("from an earlier run")  # never trusted
    run_cfg, restored = node._restore()
    d = tmp_path / "ha-node_a"
    assert restored and run_cfg.checkpoint_path == d / "cp.json"
    assert json.loads((d / "cp.json").read_text())["commit_ts"] == 5
    assert (d / "cp.json.lifts").read_text().splitlines() == [old, new]  # the union, each line once
    assert (d / "cp.json.paused").read_text() == "local\n"
    assert not (d / "stale.backlog").exists()
    assert all(s.options["ha_epoch"] == 42 and s.options["ha_lease"] == 10 for s in run_cfg.senders)
    # a file name in the state that would leave the directory is refused
    node.coord = FakeCoord(pack_state({"checkpoint": cp, "files": {"/../../x": "y"}}), {})  # type: ignore[assignment]
    from capturer.ha.coord import CoordinationError

    with pytest.raises(CoordinationError):
        node._restore()


def test_with_ha_the_sources_are_let_go_only_up_to_the_slowest_sender() -> None:
    from capturer.app import Capturer
    from capturer.pipeline.checkpoint import Checkpoint, SenderPosition

    ahead, behind = Position("bin.000002", 500), Position("bin.000001", 100)
    cp = Checkpoint(9, {"r": ahead, "q": ahead}, {}, {
        "fast": SenderPosition(offset=90, regions={"r": ahead}),
        "slow": SenderPosition(offset=10, regions={"r": behind}),
        "gone": SenderPosition(offset=1, regions={"r": Position("bin.000001", 4)}, detached=True)})
    assert Capturer._slowest_cut(cp) == {"r": behind, "q": ahead}
