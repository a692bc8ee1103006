"""Senders in processes of their own (``process = true``, senders/process.py),
with the real local sender in a real child process: what it writes must be what
the same sender writes in-process, for every kind of transaction; a child killed
with -9 makes a retriable error and the next send starts a new child; a child's
refusal comes back as the same SinkError."""

from __future__ import annotations

import datetime as dt
import decimal
import os
import signal
from pathlib import Path

import pytest

from capturer import config
from capturer.errors import SinkError
from capturer.model import ColumnInfo, Ddl, Position, RowChange, SnapshotMark, TableSchema, TsPosition, Txn
from capturer.model.spill import SpillWriter
from senders import CATALOG
from senders.local.sender import LocalSender
from senders.process import ProcessSender

S = TableSchema("d", "t", ("id", "amount", "at", "raw", "note"), ("id",), (), (3, 246, 12, 252, 15),
                (ColumnInfo(3), ColumnInfo(246, precision=10, scale=2), ColumnInfo(12), ColumnInfo(252, binary=True),
                 ColumnInfo(15)))


def row(i: int) -> dict[str, object]:
    return {"id": i, "amount": decimal.Decimal(f"{i}.25"), "at": dt.datetime(2026, 1, 2, 3, 4, 5, i % 1000),
            "raw": bytes([i % 256, 0, 255]), "note": "\u00e9\U0001f600\x00'\"\\" + "x" * (i % 7)}


def txns() -> list[Txn]:
    out = [Txn("a", 100 << 18, Position("bin.000001", 10), tuple(RowChange(S, "insert", None, row(i))
                                                                 for i in range(5)), gtid="0-1-1"),
           Txn("b", 101 << 18, TsPosition(101 << 18), (RowChange(S, "update", row(1), {**row(1), "note": None}),
                                                       RowChange(S, "delete", row(2), None))),
           Txn("a", 102 << 18, Position("bin.000001", 20), ddl=Ddl("d", "ALTER TABLE t ADD c INT", "t", "d", 0)),
           Txn("b", 103 << 18, TsPosition(103 << 18), (RowChange(S, "read", None, row(7)),),
               snapshot=SnapshotMark("run1", 3, True))]
    w = SpillWriter(None, 1000)  # a transaction on disk, as the regions hand over big ones
    w.add([RowChange(S, "insert", None, row(i)) for i in range(100, 5100)])
    out.append(Txn("a", 104 << 18, Position("bin.000001", 30), w.finish()))
    return out


def options(tmp: Path, name: str) -> dict[str, object]:
    p = tmp / f"{name}.cfg"
    p.write_text(f"[global]\ntype=local\n[local]\nfilepath={tmp / name / 'out.jsonl'}\nprocess=true\n")
    (sc,) = config.load_sender_config(p, CATALOG)
    return sc.options


def test_a_sender_in_its_own_process_writes_what_it_writes_in_process(tmp_path: Path) -> None:
    ps = ProcessSender("local", options(tmp_path, "proc"), spill_rows=2000, spill_dir=str(tmp_path / "spill"))
    here = LocalSender("local", {k: v for k, v in options(tmp_path, "here").items() if k != "process"})
    batch = txns()
    try:
        ps.open()
        child = ps.proc
        assert child is not None and child.pid != os.getpid()
        ps.send(batch[:2])
        ps.send(batch[2:])
        assert ps.proc is child  # one child for the whole run
    finally:
        ps.close()
    assert child.returncode == 0  # closed, not killed
    here.open()
    here.send(batch[:2])
    here.send(batch[2:])
    here.close()
    got = (tmp_path / "proc" / "out.jsonl").read_bytes()
    want = (tmp_path / "here" / "out.jsonl").read_bytes()
    assert got.count(b"\n") == 5 + 2 + 1 + 1 + 5000
    assert got == want


def test_sender_processes_share_one_encoding_and_each_child_gets_every_schema_it_needs(tmp_path: Path) -> None:
    """Two senders in processes get each transaction's values encoded once (kept on the
    transaction), schemas numbered for both: the second child must still be sent the
    schemas the first one's encoding made, a schema met inside a big transaction on its
    way, and a child started again (kill -9) all of them; each file is byte for byte
    what the sender writes in-process."""
    s2 = TableSchema("d", "u", ("k", "v"), ("k",), (), (15, 3), (ColumnInfo(15), ColumnInfo(3)))
    s3 = TableSchema("d", "t", S.columns + ("c",), ("id",), (), S.column_types + (3,), S.column_info + (ColumnInfo(3),))
    w = SpillWriter(None, 1000)  # a big one whose second table appears only in its last chunk
    w.add([RowChange(S, "insert", None, row(i)) for i in range(200, 2200)] +
          [RowChange(s3, "insert", None, {**row(9000), "c": 1})])
    batches = [txns()[:2], [Txn("a", 110 << 18, Position("bin.000001", 40),
                                (RowChange(s2, "insert", None, {"k": "é", "v": 1}),))],
               [Txn("b", 111 << 18, TsPosition(111 << 18), (RowChange(s3, "insert", None, {**row(3), "c": 7}),
                                                            RowChange(s2, "delete", {"k": "é", "v": 1}, None)))],
               [Txn("a", 112 << 18, Position("bin.000001", 50), w.finish())],
               [Txn("b", 113 << 18, TsPosition(113 << 18), (RowChange(s2, "insert", None, {"k": "z", "v": 2}),))]]
    one = ProcessSender("local", options(tmp_path, "one"))
    two = ProcessSender("local", options(tmp_path, "two"))
    here = LocalSender("local", {k: v for k, v in options(tmp_path, "here").items() if k != "process"})
    try:
        one.open()
        two.open()
        here.open()
        for i, b in enumerate(batches):
            one.send(b)  # encodes it (and numbers its schemas)
            if i == 3:
                assert two.proc is not None
                os.kill(two.proc.pid, signal.SIGKILL)  # the next send starts a child that knows nothing
                two.proc.wait()
            two.send(b)  # the same values, and the schemas its child has not had
            here.send(b)
        assert "_wire_pieces" in batches[2][0].__dict__  # kept for the other child
        assert two.restarts == 1
    finally:
        one.close()
        two.close()
        here.close()
    want = (tmp_path / "here" / "out.jsonl").read_bytes()
    assert want.count(b"\n") == 5 + 2 + 1 + 2 + 2001 + 1
    assert (tmp_path / "one" / "out.jsonl").read_bytes() == want
    assert (tmp_path / "two" / "out.jsonl").read_bytes() == want


def test_a_child_that_dies_is_a_retriable_error_and_the_next_send_starts_another(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # the child kills itself (SIGKILL) at its second write to the file: in the middle of a send
    monkeypatch.setenv("CAPTURER_FAILPOINTS", "local.write=kill@2")
    ps = ProcessSender("local", options(tmp_path, "proc"))
    batch = txns()
    try:
        ps.open()
        first = ps.proc
        assert first is not None
        ps.send(batch[:1])
        with pytest.raises(SinkError) as err:
            ps.send(batch[1:2])
        assert err.value.retriable and "process exited (code -9)" in str(err.value)
        ps.send(batch[1:2])  # the base class retries the same batch: a new child
        assert ps.proc is not None and ps.proc.pid != first.pid and ps.restarts == 1
        assert ps.status()["process"] == {"pid": ps.proc.pid, "restarts": 1}
        # a child found dead between batches is replaced before the batch is sent: no error
        second = ps.proc
        os.kill(second.pid, signal.SIGKILL)
        second.wait()
        ps.send(batch[2:3])
        assert ps.proc is not None and ps.proc.pid not in (first.pid, second.pid) and ps.restarts == 2
    finally:
        ps.close()
    lines = (tmp_path / "proc" / "out.jsonl").read_bytes().splitlines()
    assert len(lines) == 5 + 2 + 1  # every batch once: the killed child wrote nothing of the second


def test_the_childs_refusal_comes_back_with_its_reason(tmp_path: Path) -> None:
    opts = options(tmp_path, "proc")
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    opts["filepath"] = str(blocker / "out.jsonl")  # its directory is a file: open() fails in the child
    ps = ProcessSender("local", opts)
    try:
        with pytest.raises(SinkError) as err:
            ps.open()
        assert "not-a-dir" in str(err.value)
    finally:
        ps.close()


def test_the_child_dies_with_the_capturer(tmp_path: Path) -> None:
    """kill -9 of the capturer: its sender process goes at once, even in the middle of
    a batch (a batch of a dead capturer must not land after its successor replayed it)."""
    import socket
    import subprocess
    import sys
    import time

    # a "MySQL server" that accepts connections and never greets: the child's sender blocks in open()
    # (connect_timeout 120 s), not reading its pipe, so only the parent-death signal can end it now
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    p = tmp_path / "m.cfg"
    p.write_text(f"[global]\ntype=mysql\n[mysql]\nhost=127.0.0.1\nport={silent.getsockname()[1]}\nuser=u\n"
                 "password=secret\nconnect_timeout=120\nprocess=true\n")
    (sc,) = config.load_sender_config(p, CATALOG)
    opts = sc.options
    script = tmp_path / "capturer.py"
    script.write_text(
        "import sys, threading, time\n"
        f"sys.path.insert(0, {str(Path(__file__).resolve().parents[2])!r})\n"
        "from senders.process import ProcessSender\n"
        f"ps = ProcessSender('mysql', {opts!r})\n"
        "threading.Thread(target=ps.open, daemon=True).start()\n"
        "while ps.proc is None:\n"
        "    time.sleep(0.01)\n"
        "time.sleep(1)\n"
        "print(ps.proc.pid, flush=True)\n"
        "time.sleep(600)\n")
    parent = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        child = int(parent.stdout.readline())  # type: ignore[union-attr]
        os.kill(child, 0)  # alive
        parent.kill()
        parent.wait()
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            try:
                os.kill(child, 0)
            except ProcessLookupError:
                break
            if Path(f"/proc/{child}/stat").read_text().split()[2] == "Z":
                break
            time.sleep(0.05)
        else:
            os.kill(child, signal.SIGKILL)
            raise AssertionError("the sender's process outlived its capturer")
    finally:
        if parent.poll() is None:
            parent.kill()
        silent.close()


def test_batching_is_the_real_senders(tmp_path: Path) -> None:
    """A sender that sets its batching from its options (Spark: batch_rows,
    batch_interval) batches the same in its own process."""
    p = tmp_path / "s.cfg"
    p.write_text(f"[global]\ntype=spark\n[spark]\nwarehouse={tmp_path / 'wh'}\nbatch_rows=70000\n"
                 "batch_interval=3.5\nprocess=true\n")
    (sc,) = config.load_sender_config(p, CATALOG)
    ps = ProcessSender("spark", sc.options, queue_rows=1000)
    assert (ps.batch_rows, ps.linger) == (70_000, 3.5)
    assert ps.queue.capacity == 140_000  # room for two batches, as the Spark sender asks
    assert ps.proc is None  # nothing started before open()


def test_the_child_follows_the_capturers_lease_and_writes_nothing_past_it(tmp_path: Path) -> None:
    """High availability: the child runs in a session of its own, so a capturer frozen (SIGSTOP) past its
    lease leaves it running, with a batch in hand or the next one already in its pipe. It follows the
    capturer's lease file (``ha_lease_file``, renewed by the lease keeper only while the capturer runs):
    once the lease ran out it ends itself (releasing the file's lock for the new active, as a kill -9
    would), a new child refuses to open, and the capturer gets ``Fenced`` (never retried); nothing more is
    written. Before, its lease guard was never armed: it wrote every batch it was handed."""
    import time

    from capturer.errors import Fenced
    from capturer.util import fencing

    lease = fencing.SharedLease(tmp_path / "lease", create=True)
    # held for 10 s, never renewed: long enough for the child to start and write the first batch on a loaded
    # machine (2 s ran out before the child had opened in 2 of 4 runs at a load of 13-15); a guard's lease only
    # grows, so it cannot be shortened afterwards
    lease.write(time.monotonic() + 10.0, 0, 1)
    opts = {**options(tmp_path, "proc"), "ha_epoch": 7, "ha_lease": 4, "ha_lease_file": str(tmp_path / "lease")}
    ps = ProcessSender("local", opts, spill_rows=2000, spill_dir=str(tmp_path / "spill"))
    batch = txns()
    out = tmp_path / "proc" / "out.jsonl"
    try:
        ps.open()
        ps.send(batch[:1])
        assert out.read_bytes().count(b"\n") == 5
        child = ps.proc
        assert child is not None
        child.wait(60)  # not renewed (the capturer is frozen): the lease runs out, the child ends itself
        assert child.returncode == 3
        with pytest.raises(Fenced, match="epoch 7"):  # a new child refuses to open
            ps.send(batch[1:2])
        lease.write(time.monotonic() + 60, 2, 2)  # renewed, but lost (the leader key is another's): refused
        with pytest.raises(Fenced):
            ps.send(batch[1:2])
    finally:
        ps.close()
    assert out.read_bytes().count(b"\n") == 5  # nothing of the second batch


def test_the_child_gets_the_checkpoints_resume_state(tmp_path: Path) -> None:
    """The open message's seventh element, the sender's state in the checkpoint, reaches the child's
    sender also when the eighth (its name) follows, as the capturer always sends it: the file sender
    then refuses to cut a transaction the checkpoint says was acknowledged (a file changed by something
    else), as in-process. Before, the child read it only from a message of exactly seven elements: it was
    always dropped, and the acknowledged transaction was cut."""
    opts = options(tmp_path, "proc")
    ps = ProcessSender("local", opts, spill_rows=2000, spill_dir=str(tmp_path / "spill"))
    try:
        ps.open()
        ps.send(txns()[:1])
        state = ps.position_state
    finally:
        ps.close()
    assert isinstance(state, dict) and state.get("bytes")
    out = tmp_path / "proc" / "out.jsonl"
    data = out.read_bytes()
    out.write_bytes(data[:-10])  # something else cut the acknowledged transaction short
    again = ProcessSender("local", opts, spill_rows=2000, spill_dir=str(tmp_path / "spill"))
    again.resume_state = state
    try:
        with pytest.raises(SinkError, match="changed by something else") as ei:
            again.open()
        assert not ei.value.retriable
    finally:
        again.close()
