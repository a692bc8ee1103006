"""``python -m capturer --check``: it refuses what a start refuses (and what a start
finds only later), connecting to nothing and writing nothing. Run as the CLI runs.

Each case starts from a sandbox that passes (``test_a_good_config_passes``), breaks
one thing, and expects exit code 2 and a line naming the file (and line/key)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
PASSWORD = "Pw-s3cr-et"


@dataclass
class Box:
    tmp: Path
    sentinel: socket.socket  # the region's "server": a check must never connect to it

    @property
    def cfg(self) -> Path:
        return self.tmp / "config.cfg"

    @property
    def snd(self) -> Path:
        return self.tmp / "senderConfig.cfg"

    @property
    def flt(self) -> Path:
        return self.tmp / "filter_rule.txt"

    @property
    def cp(self) -> Path:
        return self.tmp / "checkpoint.json"

    def side(self, suffix: str) -> Path:
        return self.cp.with_name(self.cp.name + suffix)

    def connected(self) -> bool:
        self.sentinel.setblocking(False)
        try:
            conn, _ = self.sentinel.accept()
        except BlockingIOError:
            return False
        conn.close()
        return True

    def senders(self, text: str) -> None:
        self.snd.write_text(text)

    def region(self, text: str) -> None:
        with open(self.cfg, "a") as f:
            f.write(text)


@pytest.fixture
def box(tmp_path: Path) -> Iterator[Box]:
    sentinel = socket.socket()
    sentinel.bind(("127.0.0.1", 0))
    sentinel.listen(8)
    b = Box(tmp_path, sentinel)
    b.cfg.write_text(
        "[global]\n"
        f"binlogCheckPointPath={b.cp}\n"
        f"senderConfig={b.snd}\n"
        f"filterRuleDict={b.flt}\n"
        "httpPort=0\n"
        "[region:r1]\n"
        f"host=127.0.0.1\nport={sentinel.getsockname()[1]}\nuser=capturer\npassword={PASSWORD}\nserver_id=801\n")
    b.senders(f"[global]\ntype=local\n[local]\nfilepath={tmp_path / 'out' / 'changes.jsonl'}\n")
    b.flt.write_text("include shop.*\n")
    yield b
    sentinel.close()


def tree(root: Path) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            out[str(p.relative_to(root))] = "dir" if p.is_dir() else p.read_bytes()
    return out


def check(box: Box, *extra: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``python -m capturer --config X --check``: it writes nothing and connects to nothing, whatever it says."""
    before = tree(box.tmp)
    r = subprocess.run([sys.executable, "-m", "capturer", "--config", str(box.cfg), "--check", *extra],
                       capture_output=True, text=True, cwd=str(box.tmp), timeout=120,
                       env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})})
    both = r.stdout + r.stderr
    assert "Traceback" not in both, both
    assert "s3cr" not in both, both
    assert tree(box.tmp) == before, "--check changed files"
    assert not box.connected(), "--check connected to the source"
    return r


def refused(box: Box, *needles: str, env: dict[str, str] | None = None) -> str:
    r = check(box, env=env)
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stdout == "", r.stdout
    errors = [line for line in r.stderr.splitlines() if line.startswith(("error: ", "config error: "))]
    assert errors, r.stderr
    for n in needles:
        assert any(n in line for line in errors), f"{n!r} not in an error line:\n{r.stderr}"
    return r.stderr


def test_a_good_config_passes(box: Box) -> None:
    r = check(box)
    assert r.returncode == 0 and r.stdout == "config OK\n", r.stdout + r.stderr
    assert "error:" not in r.stderr


def test_a_bad_filter_line(box: Box) -> None:
    box.flt.write_text("include shop.*\nfrobnicate shop.t\n")
    refused(box, f"{box.flt}:2:", "frobnicate")


def test_a_corrupt_checkpoint(box: Box) -> None:
    box.cp.write_text('{"version": 1, "commit_ts": 12, "regions": {"r1": {"file": "mariadb-bin.0')
    refused(box, f"{box.cp}: checkpoint is not valid JSON")


def test_a_checkpoint_naming_an_unknown_region(box: Box) -> None:
    box.cp.write_text('{"version": 1, "commit_ts": 12, "regions": {"ghost": {"file": "mariadb-bin.000001", '
                      '"pos": 4}}}')
    refused(box, f"{box.cp}: names region(s) 'ghost'")


def test_a_checkpoint_position_of_another_kind(box: Box) -> None:
    box.cp.write_text('{"version": 1, "commit_ts": 12, "regions": {"r1": {"kind": "baikaldb", "ts": 5}}}')
    refused(box, f"{box.cp}: checkpoint: regions.r1 is a baikaldb position")


def test_a_bad_paused_file(box: Box) -> None:
    box.side(".paused").write_bytes(b"local\n\xff\xfe\n")
    refused(box, f"{box.side('.paused')}: unreadable list of paused senders")


def test_a_paused_sender_is_a_note(box: Box) -> None:
    box.side(".paused").write_text("local\n")
    r = check(box)
    assert r.returncode == 0 and r.stdout == "config OK\n", r.stderr
    assert "note: sender(s) local start paused" in r.stderr


def test_a_garbage_lift_journal(box: Box) -> None:
    box.side(".lifts").write_text('{"region": "r1", "file": "mariadb-bin.000001", "pos": 400, "commit_ts": 9}\n'
                                  "garbage\n"
                                  '{"region": "r1", "file": "mariadb-bin.000001", "pos": 900, "commit_ts": 10}\n')
    refused(box, f"{box.side('.lifts')}:2: corrupt lift journal")


def test_a_lift_journal_that_is_not_text(box: Box) -> None:
    box.side(".lifts").write_bytes(b'{"region": "r1"}\n\xff\xfe\x00garbage\n')
    refused(box, f"{box.side('.lifts')}:2: not UTF-8 text")


def test_a_garbage_postgresql_relation_journal(box: Box) -> None:
    pytest.importorskip("psycopg")
    box.region("[region:pg]\ntype=postgresql\nhost=127.0.0.1\nport=5\nuser=capturer\ndbname=app\n")
    journal = box.side(".postgresql.pg")
    journal.write_text('{"lsn": "0/10", "rel": {}}\n{"lsn": "0/20", "rel": 7}\n')
    refused(box, f"{journal}:1: corrupt relation journal")


def test_the_journal_of_a_region_in_a_worker_process(box: Box) -> None:
    """process = true: the worker builds the kind's region (and reads its journal) in its
    own process; the check builds it too, and removes the worker's socket directory."""
    pytest.importorskip("psycopg")
    box.region("[region:pg]\ntype=postgresql\nhost=127.0.0.1\nport=5\nuser=capturer\ndbname=app\nprocess=true\n")
    journal = box.side(".postgresql.pg")
    journal.write_text("not json\n{}\n")
    temp = box.tmp.parent / f"{box.tmp.name}-tmpdir"
    temp.mkdir()
    refused(box, f"{journal}:1: corrupt relation journal", env={"TMPDIR": str(temp)})
    journal.unlink()
    r = check(box, env={"TMPDIR": str(temp)})
    assert r.returncode == 0, r.stderr
    assert list(temp.iterdir()) == [], "the worker region's socket directory was left behind"


def test_an_unwritable_local_sender_directory(box: Box) -> None:
    (box.tmp / "a-file").write_text("")
    box.senders(f"[global]\ntype=local\n[local]\nfilepath={box.tmp / 'a-file' / 'out' / 'changes.jsonl'}\n")
    refused(box, f"{box.snd}:4: [local] filepath", f"{box.tmp / 'a-file'} is not a directory")


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes anywhere")
def test_a_read_only_local_sender_directory(box: Box) -> None:
    ro = box.tmp / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        box.senders(f"[global]\ntype=local\n[local]\nfilepath={ro / 'changes.jsonl'}\n")
        refused(box, f"{box.snd}:4: [local] filepath", f"{ro} is not writable")
    finally:
        ro.chmod(0o755)


def test_an_unwritable_checkpoint_directory(box: Box) -> None:
    (box.tmp / "a-file").write_text("")
    box.cfg.write_text(box.cfg.read_text().replace(f"binlogCheckPointPath={box.cp}",
                                                   f"binlogCheckPointPath={box.tmp / 'a-file' / 'cp.json'}"))
    refused(box, f"{box.cfg}:2: [global] binlogCheckPointPath", "the checkpoint cannot be written")


def test_a_missing_tls_file(box: Box) -> None:
    box.region(f"[region:far]\ntype=remote\naddress=127.0.0.1:2\ntls_ca={box.tmp / 'nope.pem'}\n")
    refused(box, f"{box.cfg}:15: [region:far] tls_ca: no such file: {box.tmp / 'nope.pem'}")


def test_a_tls_file_that_is_not_pem(box: Box) -> None:
    (box.tmp / "ca.pem").write_text("not a certificate\n")
    box.region(f"[region:far]\ntype=remote\naddress=127.0.0.1:2\ntls_ca={box.tmp / 'ca.pem'}\n")
    refused(box, f"{box.cfg}:15: [region:far] tls_ca = {box.tmp / 'ca.pem'}: not a PEM CA certificate")


def test_spark_needs_java_only_when_a_session_will_start(box: Box) -> None:
    pytest.importorskip("pyspark")
    pytest.importorskip("pyarrow")
    wh = box.tmp / "lake"
    box.senders(f"[global]\ntype=local,spark\n[local]\nfilepath={box.tmp / 'out.jsonl'}\n[spark]\nwarehouse={wh}\n")
    no_java = {"JAVA_HOME": str(box.tmp / "no-java")}
    refused(box, f"{box.snd}:5: [spark] compaction_interval", "needs Java", env=no_java)
    # writer=arrow without compaction starts no session: no Java needed
    box.senders(box.snd.read_text() + "compaction_interval=0\n")
    r = check(box, env=no_java)
    assert r.returncode == 0 and r.stdout == "config OK\n", r.stderr


def test_a_stray_backlog_segment_stays(box: Box) -> None:
    """A start removes backlog segments no checkpoint refers to; a check (start.sh runs
    it while the capturer may still run) leaves them."""
    seg = box.side(".backlog") / "00000000000000000001.seg"
    seg.parent.mkdir()
    seg.write_bytes(b"records no checkpoint refers to")
    r = check(box)  # (check() asserts that nothing changed)
    assert r.returncode == 0, r.stderr


def test_a_backlog_segment_the_checkpoint_needs_is_missing_or_damaged(box: Box) -> None:
    from capturer.pipeline.backlog import BacklogMark
    from capturer.pipeline.checkpoint import Checkpoint, save_checkpoint

    seg = box.side(".backlog") / "00000000000000000001.seg"
    save_checkpoint(box.cp, Checkpoint(commit_ts=12, backlog=BacklogMark(5, seg.name, 40)))
    refused(box, f"segment {seg} is missing")
    seg.parent.mkdir()
    seg.write_bytes(b"\x05" * 40)
    refused(box, f"backlog segment {seg}")


def test_problems_are_all_listed(box: Box) -> None:
    """Independent problems come out together, one line each."""
    (box.tmp / "a-file").write_text("")
    box.flt.write_text("frobnicate\n")
    box.senders(f"[global]\ntype=local\n[local]\nfilepath={box.tmp / 'a-file' / 'x.jsonl'}\n")
    err = refused(box, f"{box.flt}:1:", f"{box.snd}:4: [local] filepath")
    assert "check failed: 2 problem(s)" in err


def test_a_bad_config_is_still_a_config_error(box: Box) -> None:
    box.cfg.write_text(box.cfg.read_text().replace("httpPort=0", "httpPort=-1"))
    refused(box, f"config error: {box.cfg}:5: [global] httpPort: bad value '-1'")


def test_connect_goes_with_check(box: Box) -> None:
    r = subprocess.run([sys.executable, "-m", "capturer", "--config", str(box.cfg), "--connect"],
                       capture_output=True, text=True, cwd=str(box.tmp), env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 2 and "--connect goes with --check" in r.stderr, r.stderr


def test_a_postgresql_region_with_a_binlog_position_in_the_checkpoint(box: Box) -> None:
    """A PostgreSQL region refuses another kind's position only when it connects; the check says it now."""
    pytest.importorskip("psycopg")
    box.region("[region:pg]\ntype=postgresql\nhost=127.0.0.1\nport=5\nuser=capturer\ndbname=app\n")
    box.cp.write_text('{"version": 1, "commit_ts": 12, "regions": {"pg": {"file": "mariadb-bin.000001", "pos": 4}}}')
    refused(box, f"{box.cp}: checkpoint: regions.pg is a mysql position, but [region:pg] is type=postgresql")


def test_grants_as_mariadb_and_mysql_list_them() -> None:
    from capturer.util.grants import Grants

    g = Grants.parse([
        "GRANT USAGE ON *.* TO `u`@`%` IDENTIFIED BY PASSWORD '*0123'",
        "GRANT REPLICATION SLAVE, BINLOG MONITOR ON *.* TO `u`@`%`",
        "GRANT SELECT, INSERT ON `shop\\_1`.* TO `u`@`%`",
        "GRANT ALL PRIVILEGES ON `app%`.* TO `u`@`%`",
        "GRANT UPDATE (`a`, `b`) ON `x`.`t` TO `u`@`%`",
        "GRANT PROXY ON ''@'%' TO 'u'@'%'",
    ])
    assert g.has_global({"REPLICATION SLAVE"}) and not g.has_global({"SELECT"}) and not g.roles
    assert g.on_db("shop_1", "INSERT") and not g.on_db("shopx1", "INSERT") and not g.on_db("shop_1", "DELETE")
    assert g.on_db("app", "DROP") and g.on_db("app_2", "CREATE") and not g.on_db("x", "UPDATE")
    root = Grants.parse(["GRANT ALL PRIVILEGES ON *.* TO `root`@`localhost` WITH GRANT OPTION"])
    assert root.has_global({"REPLICATION SLAVE"}) and root.on_db("anything", "DELETE")
    assert Grants.parse(["GRANT `capture_role` TO `u`@`%`"]).roles
    # a database whose name holds a space, a dot or a backquote (SHOW GRANTS quotes it): read whole
    odd = Grants.parse(["GRANT SELECT ON `we\"ird db.1``x`.* TO `u`@`%`", "GRANT INSERT ON `a b`.`t u` TO `u`@`%`"])
    assert odd.on_db('we"ird db.1`x', "SELECT") and not odd.on_db("we", "SELECT") and not odd.on_db("a b", "INSERT")


def test_rebuild_backlog_is_not_checked(box: Box) -> None:
    """--rebuild-backlog moves the backlog aside: a check must not, so it refuses the pair."""
    r = subprocess.run([sys.executable, "-m", "capturer", "--config", str(box.cfg), "--check", "--rebuild-backlog"],
                       capture_output=True, text=True, cwd=str(box.tmp), env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 2 and "--rebuild-backlog goes with a start, not with --check" in r.stderr, r.stderr
