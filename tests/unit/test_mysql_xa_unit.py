"""XA transactions of a MySQL/MariaDB region without a server (capturer/regions/mysql/xa.py):
the decisions as the binlog writes them, the xid keys, the transactions held, and the
prepared marks a position carries through the checkpoint and the wire format. The real
binlog shapes are in tests/integration/test_source_txn_shapes.py."""

from __future__ import annotations

import pytest

from capturer.model import Position, PreparedXa, position_from_json
from capturer.model.wire import position_json, read_position
from capturer.regions.mysql.binlog import xa_decision, xid_key
from capturer.regions.mysql.xa import Prepared


def test_decisions_as_the_binlog_writes_them() -> None:
    assert xa_decision("XA COMMIT X'7831',X'',1") == ("COMMIT", "1:7831:", False)
    assert xa_decision("XA ROLLBACK X'7832',X'6232',7") == ("ROLLBACK", "7:7832:6232", False)
    assert xa_decision("xa commit x'00FF27' , x'71' , 77 ONE PHASE") == ("COMMIT", "77:00ff27:71", True)
    # the same xid as the XA_PREPARE event names it
    assert xa_decision("XA COMMIT X'00ff27',X'712762',77")[1] == xid_key(77, b"\x00\xff'", b"q'b")
    for other in ("XA END X'7831',X'',1", "XA START X'7831',X'',1", "XA PREPARE X'7831',X'',1", "COMMIT",
                  "XA RECOVER", "INSERT INTO t VALUES ('XA COMMIT X''01'',X'''',1')"):
        assert xa_decision(other) is None, other


def test_prepared_holds_in_prepare_order_and_keeps_a_resume_points_marks() -> None:
    p = Prepared()
    a, b, c = (PreparedXa(f"1:{x}:", "mariadb-bin.000001", 100 + i, f"0-1-{i}") for i, x in enumerate("abc"))
    p.hold(a, ("ra",), False)
    p.hold(b, ("rb",), False)
    p.hold(c, ("rc",), False)
    assert p.marks() == (a, b, c)
    assert p.take(b.xid) == (b, ("rb",), False) and p.take(b.xid) is None
    # a group read again replaces the one held (and goes last: it was prepared last)
    a2 = PreparedXa(a.xid, "mariadb-bin.000002", 4, "0-1-9")
    p.hold(a2, ("ra2",), False)
    assert p.marks() == (c, a2)
    # a resume point's marks: the others go, those not held are to be read again
    assert p.keep_only((a2, b)) == [b]
    assert p.marks() == (a2,) and len(p) == 1


def test_marks_survive_the_checkpoint_and_the_wire() -> None:
    xa = (PreparedXa("1:6b:", "mariadb-bin.000001", 5246, "0-1-20"), PreparedXa("77:00ff27:71", "mariadb-bin.000002", 4))
    pos = Position("mariadb-bin.000003", 900, "0-1-30", (), xa)
    d = pos.checkpoint_json()
    assert d["xa"][0] == {"xid": "1:6b:", "file": "mariadb-bin.000001", "pos": 5246, "gtid": "0-1-20"}
    back = position_from_json(d)
    assert isinstance(back, Position) and back.xa == xa and back == pos
    assert read_position(position_json(pos)).xa == xa
    # positions compare by (file, pos) only; one without marks writes none
    assert Position("mariadb-bin.000003", 900) == pos and "xa" not in Position("f.000001", 4).checkpoint_json()
    for bad in ({"xa": {}}, {"xa": [{"xid": "", "file": "f", "pos": 4}]}, {"xa": [{"xid": "1:6b:", "file": "f", "pos": 2}]},
                {"xa": ["1:6b:"]}):
        with pytest.raises(ValueError):
            Position.from_json({"file": "f.000001", "pos": 4, **bad})


def test_the_xids_xa_recover_lists() -> None:
    """``XA RECOVER FORMAT='SQL'`` (MariaDB): hex where the bytes are not printable, text where
    they are (the branch qualifier and format id left out where empty and 1); plain ``XA RECOVER``
    (MySQL): the lengths cut the data."""
    from capturer.regions.mysql.xa import _prepared_now

    class Cur:
        def __init__(self, rows: list[tuple[object, ...]], sql: bool) -> None:
            self.rows, self.sql = rows, sql

        def execute(self, q: str) -> None:
            import pymysql

            if "FORMAT" in q and not self.sql:
                raise pymysql.err.ProgrammingError(1064, "syntax")

        def fetchall(self) -> list[tuple[object, ...]]:
            return self.rows

    class Region:
        where = "region r1"

    rows = [(1, 4, 0, "'pre2'"), (3, 2, 1, "X'01ff',X'62',3"), (1, 3, 3, "'a''b','c d'")]
    assert _prepared_now(Region(), Cur(rows, True)) == {"1:70726532:", "3:01ff:62", "1:612762:632064"}
    raw = [(1, 4, 0, b"pre2"), (3, 2, 1, b"\x01\xffb"), (7, 1, 2, "xyz")]
    assert _prepared_now(Region(), Cur(raw, False)) == {"1:70726532:", "3:01ff:62", "7:78:797a"}
