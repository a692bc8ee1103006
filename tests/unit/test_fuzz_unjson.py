"""Fuzzing the applier's json reading in C (capturer/_native/unjson.c) against its Python specification
(capturer/apply/regroup.py: ``decode_json_py``, ``_untype_py``).

* ``kafka_unjson``: envelopes the Kafka sender really writes (the C encoder and the Python one) of random rows
  (ints small, negative and past 64 bits, floats with exponents and -0.0, text with quotes, backslashes,
  control characters, non-ASCII and astral characters, Decimals, datetimes, bytes as base64, sets, NULLs);
  random JSON texts in every layout ``json.dumps`` makes (ASCII escapes or not, indented, spaced), with
  nested values, duplicate keys, lone surrogate escapes, numbers JSON forbids; and those texts mutated byte
  by byte (characters that matter to JSON put in, taken out, swapped), cut short and given trailing bytes.
  Wherever C gives an answer it must be exactly the specification's (types, dict order, floats bit for bit),
  and the specification must not have refused that text; where it gives None the specification reads it
  (or refuses it). The envelopes the sender writes must all be read in C (the fast path is the common one).
* ``kafka_untype``: random images of typed columns (decimal, datetime, date, time, set) with texts their
  parsers take and refuse, values that are not text, base64 columns, columns missing: the same dict (values,
  types, order) or the same exception as ``_untype_py``.
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
import random
from typing import Any

import pytest

from capturer.apply import regroup
from capturer.model import ColumnInfo, Position, RowChange, TableSchema, Txn
from capturer.model.encode import _fastrows
from senders.kafka.format import json_envelope

pytestmark = pytest.mark.skipif(not hasattr(_fastrows, "kafka_unjson"),
                                reason="capturer._fastrows not built, or built before unjson.c")

TYPES = (3, 253, 246, 18, 10, 19, 252, 248, 5, 8, 245)
COLS = ("id", "s", "dec", "at", "day", "dur", "blob", "tags", "f", "big", "doc")
SCHEMA = TableSchema("app", "t\"é", COLS, ("id",), (), TYPES, tuple(ColumnInfo(t, binary=(t == 252)) for t in TYPES))
TEXTS = ["", "a", "é", "😀", "\"", "\\", "\n\t\x00\x1f", "\u2028", "a\"b\\c", "x" * 70, "名前", "\x7f", "/"]


def same(a: Any, b: Any) -> bool:
    if type(a) is not type(b):
        return False
    if isinstance(a, (float, decimal.Decimal)):
        return repr(a) == repr(b)  # (-0.0, NaN)
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return bool(a == b)


def rand_text(rng: random.Random) -> str:
    return "".join(rng.choice(TEXTS) for _ in range(rng.randrange(4)))


def rand_row(rng: random.Random, i: int) -> dict[str, Any]:
    row: dict[str, Any] = {
        "id": rng.choice([i, -i, 2**63 - 1, -(2**63), 2**64 + i, 10**30]), "s": rand_text(rng),
        "dec": decimal.Decimal(rng.randrange(-10**12, 10**12)) / 10**rng.randrange(6),
        "at": dt.datetime(2026, 1, 1) + dt.timedelta(microseconds=rng.randrange(10**13)),
        "day": dt.date(2000, 2, 29) + dt.timedelta(days=rng.randrange(9000)),
        "dur": dt.timedelta(microseconds=rng.randrange(-10**11, 10**11)),
        "blob": bytes(rng.randrange(256) for _ in range(rng.randrange(9))),
        "tags": set(rng.sample(["a", "b", "c"], rng.randrange(4))),
        "f": rng.choice([0.0, -0.0, 1.5, 1e300, -2.5e-308, 5e-324, rng.random() * 10**rng.randrange(-30, 30)]),
        "big": rng.choice([0, -1, 2**63 - 1, 999999999999999999, 1000000000000000000]),
        "doc": rng.choice([None, '{"k": [1, 2]}', "[]"]),
    }
    for c in rng.sample(COLS[1:], rng.randrange(3)):
        row[c] = None
    return row


def envelopes(seed: int, n: int = 300) -> list[bytes]:
    """What the Kafka sender writes for random changes: its Python encoder and its C one."""
    rng = random.Random(seed)
    out: list[bytes] = []
    txn = Txn("r1", 1 << 30, Position("b.000001", 4, gtid="0-1-2"), ())
    changes = []
    for i in range(n):
        op = rng.choice(["insert", "update", "delete"])
        before = rand_row(rng, i) if op != "insert" else None
        after = rand_row(rng, i) if op != "delete" else None
        ch = RowChange(SCHEMA, op, before, after)  # type: ignore[arg-type]
        changes.append(ch)
        out.append(json_envelope(txn, i, ch, {"insert": "c", "update": "u", "delete": "d"}[op], 1))
    txn = Txn("r1", 1 << 30, Position("b.000001", 4), tuple(changes))
    pieces = regroup_pieces(txn)
    msgs = _fastrows.kafka_json(changes, 0, len(changes), pieces,
                                lambda s: ("t", 3, b'"db":"app","table":"t\\"\xc3\xa9",', ("id",), b"app.t"),
                                lambda v: __import__("capturer.model.encode", fromlist=["x"])._fallback(v),
                                (("region", b"r1"), ("commit_ts", b"1")), True)
    out += [m[3] for m in msgs if m[3] is not None]
    return out


def regroup_pieces(txn: Txn) -> tuple[bytes, bytes, bytes, bytes, bytes]:
    from senders.kafka.format import json_txn_pieces

    return json_txn_pieces(txn, 1)


@pytest.fixture(autouse=True)
def _exact_json(monkeypatch: pytest.MonkeyPatch) -> None:
    """The specification read with the json module: orjson, which it takes first where installed, makes
    floats of integers past 64 bits (2**64 -> 1.8446744073709552e+19); the json module and the C path keep
    them (a BIGINT UNSIGNED never gets there; Decimals travel as text)."""
    monkeypatch.setattr(regroup, "_fast_loads", None)


def spec(value: bytes) -> Any:
    try:
        return regroup.decode_json_py(value)
    except (ValueError, TypeError, KeyError, UnicodeDecodeError) as exc:
        return type(exc)


def check(value: bytes) -> bool:
    """True when C read it (then exactly as the specification)."""
    got = _fastrows.kafka_unjson(value)
    if got is None:
        return False
    want = spec(value)
    assert isinstance(want, tuple), (value, want, got)
    assert same(got, want), (value, got, want)
    return True


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_every_envelope_the_sender_writes_is_read_in_c_as_the_specification(seed: int) -> None:
    msgs = envelopes(seed)
    assert len(msgs) > 600
    for v in msgs:
        assert check(v), v


def rand_value(rng: random.Random, depth: int = 0) -> Any:
    r = rng.random()
    if r < 0.15 and depth < 3:
        return {rand_text(rng) or "k": rand_value(rng, depth + 1) for _ in range(rng.randrange(3))}
    if r < 0.25 and depth < 3:
        return [rand_value(rng, depth + 1) for _ in range(rng.randrange(3))]
    return rng.choice([None, True, False, 0, -0, 7, -12, 2**63, -(2**64) - 5, 10**40, 0.5, -0.0, 1e-7, 1.7e308,
                       rand_text(rng), rand_text(rng)])


def rand_doc(rng: random.Random) -> Any:
    """An envelope-like document: mostly the right shape, sometimes not."""
    d: dict[str, Any] = {}
    keys = ["before", "after", "op", "source", "b64", "ts_ms", "transaction", "x"]
    rng.shuffle(keys)
    for k in keys:
        if rng.random() < 0.12:
            continue
        if k in ("before", "after"):
            d[k] = rng.choice([None, {c: rand_value(rng, 3 if rng.random() < 0.9 else 0) for c in
                                      rng.sample(COLS, rng.randrange(len(COLS)))}, [], "x"])
        elif k == "source":
            src: dict[str, Any] = {"region": "r1", "position": {"file": "b", "pos": 4}, "seq": 3}
            src["db"] = rng.choice(["app", "é\"", 5, None, "\ud800"]) if rng.random() < 0.2 else "app"
            src["table"] = rand_text(rng) if rng.random() < 0.3 else "t"
            if rng.random() < 0.1:
                del src[rng.choice(["db", "table"])]
            d[k] = src if rng.random() < 0.95 else rng.choice([[], "s", None])
        elif k == "b64":
            d[k] = rng.choice([None, [], ["blob"], ["blob", "s"], "blob", [1], ["é"]])
        else:
            d[k] = rand_value(rng)
    return d


def layouts(rng: random.Random, d: Any) -> bytes:
    kw = rng.choice([{}, {"ensure_ascii": False}, {"indent": 1}, {"separators": (",", ":")},
                     {"separators": (" , ", " : "), "ensure_ascii": False}])
    text = json.dumps(d, **kw)
    if rng.random() < 0.1:  # a key twice
        text = text.replace('"op": ', '"op": 1, "op": ', 1).replace('"op":', '"op":1,"op":', 1)
    if rng.random() < 0.05:
        text = " \n" + text + "\r\n\t"
    return text.encode("utf-8", "surrogatepass")


MUTATIONS = [b'"', b"\\", b"{", b"}", b"[", b"]", b",", b":", b"-", b"0", b"01", b"e", b"E+", b".", b"\\u",
             b"\\ud800", b"\\udc00", b"\\u00e9", b"\\uD83D\\uDE00", b"\x00", b"\x1f", b"\xff", b"\xc3", b"\xed\xa0\x80",
             b"null", b"true", b"nul", b"1e999", b"-0", b"18446744073709551616", b" ", b"\t", b"\n", b""]


def mutate(rng: random.Random, v: bytes) -> bytes:
    b = bytearray(v)
    for _ in range(rng.randrange(1, 4)):
        i = rng.randrange(len(b) + 1)
        r = rng.random()
        if r < 0.4:
            b[i:i] = rng.choice(MUTATIONS)
        elif r < 0.7 and b:
            del b[i:i + rng.randrange(1, 4)]
        elif b:
            b[i:i + 1] = rng.choice(MUTATIONS)
    if rng.random() < 0.05:
        b = b[:rng.randrange(len(b) + 1)]
    return bytes(b)


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_random_texts_and_mutations_read_in_c_only_as_the_specification(seed: int) -> None:
    rng = random.Random(seed)
    base = envelopes(seed + 10, 60)
    read = declined = 0
    for _ in range(3000):
        v = layouts(rng, rand_doc(rng)) if rng.random() < 0.5 else rng.choice(base)
        if rng.random() < 0.6:
            v = mutate(rng, v)
        if check(v):
            read += 1
        else:
            declined += 1
    assert read > 500 and declined > 500  # (both paths were taken)


def test_the_edges_of_the_common_shape() -> None:
    ok = b'{"before":null,"after":{"a":%s},"op":"c","source":{"db":"d","table":"t"}}'
    for num in [b"0", b"-0", b"12", b"999999999999999999", b"1000000000000000000", b"-9223372036854775809",
                b"1.5", b"-0.0", b"1e5", b"1E+5", b"2.5e-3", b"1e400", b"-1e400", b"123456789012345678901234567890"]:
        assert check(ok % num), num
    for bad in [b"01", b"-", b"1.", b".5", b"1e", b"+1", b"NaN", b"Infinity", b"[1]", b'{"x":1}', b"nul"]:
        assert not check(ok % bad), bad
    for text in [rb'"\u00e9\ud83d\ude00\n\"\\\/"', '"é😀"'.encode(), b'"\\u0000"', b'""']:
        assert check(ok % text), text
    for text in [rb'"\ud800"', rb'"\udc00x"', rb'"\ud83dx"', b'"\xff"', b'"\xed\xa0\x80"', b'"a\nb"', rb'"\x"']:
        assert not check(ok % text), text
    assert check(b' {"op":1,"source":{"db":"d","table":"t","db2":[1,{"a":[]}]}} \n')
    assert not check(b'{"op":1,"source":{"db":"d","table":"t"}} x')
    assert not check(b'{"op":1,"op":2,"source":{"db":"d","table":"t"}}')
    assert not check(b'{"source":{"db":"d","table":"t"}}')
    assert _fastrows.kafka_unjson("not bytes") is None
    got = _fastrows.kafka_unjson(b'{"op":"c","source":{"db":"d","table":"t"},"b64":["a","a"],"after":{"a":"AA=="}}')
    assert got == ("d", "t", None, {"a": "AA=="}, frozenset({"a"}))


def rand_typed_text(rng: random.Random) -> Any:
    return rng.choice(["12.50", "-0.001", "1E+3", "NaN", "abc", "", "2026-01-02 03:04:05.123456", "2026-01-02",
                       "0000-00-00 00:00:00", "0000-00-00", "838:59:59", "-01:02:03.5", "1:2", "a,b", "x",
                       "2026-13-01", "١٢", "99999999999999999999999999:00:00", 5, None, b"x", 1.5])


@pytest.mark.parametrize("seed", [1, 2])
def test_untype_is_the_specification(seed: int) -> None:
    rng = random.Random(seed)
    convs = regroup._converters(SCHEMA)
    assert {c for c, _f, _x in convs} == {"dec", "at", "day", "dur", "tags"}
    for _ in range(3000):
        img = {c: rand_typed_text(rng) for c in rng.sample(COLS, rng.randrange(len(COLS) + 1))}
        b64 = frozenset(rng.sample(["blob", "dec", "at"], rng.randrange(3)))
        a, b = dict(img), dict(img)
        want: Any = None
        try:
            regroup._untype_py(a, convs, b64)
        except Exception as exc:  # (a text of hours past what timedelta holds: OverflowError, as before)
            want = type(exc)
        got: Any = None
        try:
            _fastrows.kafka_untype(b, convs, b64)
        except Exception as exc:
            got = type(exc)
        assert got is want, (img, got, want)
        if want is None:
            assert same(a, b), (img, a, b)


def spec_row(headers: Any, value: Any) -> Any:
    """What ``Regrouper._row`` makes of a row message's headers and value on the Python path."""
    msg = regroup.Msg("t", 0, 0, None, value, headers)
    try:
        key, seq, op = regroup.Regrouper._identity(msg)
    except (KeyError, ValueError, TypeError, AttributeError) as exc:
        return type(exc)
    if value is None:
        return key, seq, op, None
    ev = spec(value)
    return (key, seq, op, (op, *ev)) if isinstance(ev, tuple) else ev


HEADER_VALUES = [b"0", b"7", b"0012", b"123456789012345678", b"1234567890123456789", b"-1", b"+1", b"1_0", b" 1",
                 b"1 ", b"", b"\xff", b"r1", "r1", 5, None, "\u00e9".encode(), b"c", b"u", b"d", b"t", b"ddl", b"\x00"]


def rand_headers(rng: random.Random) -> Any:
    hs: list[Any] = [("region", b"r1"), ("commit_ts", b"262144000"), ("seq", str(rng.randrange(10**6)).encode()),
                     ("op", rng.choice([b"c", b"u", b"d", b"r"]))]
    for _ in range(rng.choice([0, 0, 1, 2])):
        i = rng.randrange(len(hs))
        r = rng.random()
        if r < 0.6:
            hs[i] = (hs[i][0], rng.choice(HEADER_VALUES))
        elif r < 0.7:
            hs[i] = (rng.choice(["Region", "seq", "op", b"seq"]), hs[i][1])
        elif r < 0.8:
            hs[i] = (hs[i][0], hs[i][1], b"x")
        elif r < 0.9:
            rng.shuffle(hs)
        else:
            hs = hs[:3] if rng.random() < 0.5 else [*hs, ("epoch", b"1")]
    return tuple(hs) if rng.random() < 0.03 else hs


@pytest.mark.parametrize("seed", [1, 2])
def test_unrow_is_the_python_path(seed: int) -> None:
    rng = random.Random(seed)
    base = envelopes(seed + 20, 60)
    read = declined = 0
    for _ in range(4000):
        hs = rand_headers(rng)
        value = None if rng.random() < 0.1 else rng.choice(base)
        if value is not None and rng.random() < 0.2:
            value = mutate(rng, value)
        got = _fastrows.kafka_unrow(hs, value)
        if got is None:
            declined += 1
            continue
        read += 1
        want = spec_row(hs, value)
        assert isinstance(want, tuple), (hs, value, got, want)
        assert same(got, want), (hs, value, got, want)
    assert read > 1000 and declined > 500


@pytest.mark.parametrize("where", [b'"after":{"a":%s}', b'"op":%s', b'"ts_ms":%s', b'"x":[{"y":%s}]'])
def test_integers_past_pythons_digit_limit_are_left_to_the_python_path(where: bytes) -> None:
    """int(text) refuses more digits than sys.get_int_max_str_digits() (4300 unless set; 640 at least): the
    json module raises ValueError (a bad message). C raised that ValueError out of kafka_unjson (the applier
    stopped instead of dead-lettering the message) and read past such an integer where it only skips."""
    msg = b'{"source":{"db":"d","table":"t"},' + where + (b"}" if b'"op"' in where else b',"op":"c"}')
    for n in (18, 19, 639, 640, 641, 4300, 4301, 20000):
        for sign in (b"", b"-"):
            v = msg.replace(b"%s", sign + b"7" * n)
            assert check(v) == (n <= 640), (n, sign)  # (up to 640 digits: read in C, as the specification)
    assert spec(msg.replace(b"%s", b"7" * 4301)) is ValueError
    assert check(msg.replace(b"%s", b"7" * 5000 + b".5"))  # (a float has no such limit)


def test_hostile_messages() -> None:
    """Cut short at every byte, each byte taken out, nesting past every limit, strings of megabytes, escapes cut
    short or invalid: C never raises and answers only as the specification; the specification answers a
    ValueError (a bad message), never RecursionError."""
    env = (b'{"before":{"id":1,"s":"a\\u00e9\\ud83d\\ude00\\n","f":-1.5e-3,"n":null,"t":true,"x":false},'
           b'"after":null,"op":"u","source":{"db":"d\\"","table":"t","position":{"file":"b","pos":[1,{"q":"\\u0041"}]}},'
           b'"b64":["s"],"ts_ms":123,"transaction":{"id":"x","total_order":3}}')
    assert check(env)
    for i in range(len(env)):
        assert not check(env[:i])
        check(env[:i] + env[i + 1:])
        check(env[:i] + b"\\" + env[i:])
    for n in (63, 64, 100_000):  # (C reads 63 levels in what it reads past)
        for open_, close in ((b"[", b"]"), (b'{"a":', b"}")):
            deep = open_ * n + b"1" + close * n
            for v in (b'{"op":"c","ts_ms":%s,"source":{"db":"d","table":"t"}}',
                      b'{"op":"c","source":{"db":"d","table":"t","x":%s}}',
                      b'{"op":"c","after":{"a":%s},"source":{"db":"d","table":"t"}}'):
                msg = v.replace(b"%s", deep)
                assert check(msg) == (n <= 63 and b"after" not in v)
                if n > 1000:
                    assert spec(msg) is ValueError
                    assert spec(msg[:-1]) is ValueError
    msg = b'{"op":"c","after":{"a":"%s"},"source":{"db":"d","table":"%s"},"ts_ms":"%s"}'
    for s in (b"x" * 10_000_000, b"\\n" * 3_000_000, "é😀".encode() * 1_000_000, b"\\ud83d\\ude00" * 500_000):
        assert check(msg.replace(b"%s", s))
        assert not check(msg.replace(b"%s", s)[:len(msg) + len(s) // 2])
    for e in (rb"\u", rb"\u12", rb"\u12g4", rb"\uD800\u", rb"\uD800\uDBFF", rb"\uD800\uE000", rb"\uDFFF", rb"\x",
              rb"\U0001F600", rb"\'", b"\\\x00", rb"\uD800\n"):
        for v in (b'{"op":"c","after":{"a":"%s"},"source":{"db":"d","table":"t"}}',
                  b'{"op":"c","after":{"%s":1},"source":{"db":"d","table":"t"}}',
                  b'{"op":"c","ts_ms":{"%s":1},"source":{"db":"d","table":"t"}}'):
            assert not check(v.replace(b"%s", e)), e
            assert not check(v[:v.index(b"%s")] + e)


def test_hostile_messages_with_orjson(monkeypatch: pytest.MonkeyPatch) -> None:
    """The applier's own Python path (orjson first): nesting past orjson's limit is a ValueError there too."""
    orjson = pytest.importorskip("orjson")
    monkeypatch.setattr(regroup, "_fast_loads", orjson.loads)
    deep = b'{"op":"c","ts_ms":' + b"[" * 100_000 + b"]" * 100_000 + b',"source":{"db":"d","table":"t"}}'
    assert _fastrows.kafka_unjson(deep) is None
    with pytest.raises(ValueError):
        regroup.decode_json_py(deep)


def test_untype_with_a_b64_without_len_is_the_specification() -> None:
    """kafka_untype took a failing len(b64) for 'no base64 column' and returned with the error set (SystemError);
    the Python path asks `c in b64`."""
    class Holds:  # (`in` without len())
        def __contains__(self, c: object) -> bool:
            return c == "dec"

    convs = regroup._converters(SCHEMA)
    for b64 in (None, 5, Holds()):
        for img in ({"dec": "1.5"}, {"dec": 5}, {}):
            a, b = dict(img), dict(img)
            want: Any = None
            got: Any = None
            try:
                regroup._untype_py(a, convs, b64)  # type: ignore[arg-type]
            except Exception as exc:
                want = type(exc)
            try:
                _fastrows.kafka_untype(b, convs, b64)
            except Exception as exc:
                got = type(exc)
            assert got is want, (b64, img, got, want)
            assert same(a, b)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(100, 140))
def test_random_texts_and_mutations_many_seeds(seed: int) -> None:
    test_random_texts_and_mutations_read_in_c_only_as_the_specification(seed)
    test_untype_is_the_specification(seed)


@pytest.mark.parametrize("bad", [b"7" * 5000, b"[" * 100_000 + b"]" * 100_000])
@pytest.mark.parametrize("where", [b'"after":{"a":%s}', b'"ts_ms":%s'])
def test_the_applier_takes_hostile_messages_for_bad_messages(bad: bytes, where: bytes) -> None:
    """What the applier dead-letters (on_bad_message=dead_letter) is a BadMessage: an integer past the digit limit
    raised ValueError out of C, nesting past the recursion limit RecursionError out of json.loads."""
    from types import SimpleNamespace

    from capturer.model.message import Msg

    value = b'{"op":"c","source":{"db":"d","table":"t"},' + where.replace(b"%s", bad) + b"}"
    hs = [("region", b"r1"), ("commit_ts", b"5"), ("seq", b"1"), ("op", b"c")]
    assert _fastrows.kafka_unrow(hs, value) is None  # (the applier's first call: the Python path reads it)
    msg = Msg("t", 0, 5, None, value, hs)
    with pytest.raises(regroup.BadMessage):
        regroup.Regrouper._decode(SimpleNamespace(fmt="json"), msg, "c")  # type: ignore[arg-type]
