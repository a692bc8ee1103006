"""A Decimal's text written by the C module from the number itself (capturer/_native/decimal.c), without
``str()``: every sender's writer of DECIMAL values uses it (JSON lines and Kafka messages, SQL literals, the
wire format, the lake's unscaled integers). Its specification is Python's own ``str(d)`` and
``format(d, "f")``; where it cannot answer (NaN, Infinity, a subclass, a text longer than its buffer) it
answers None and the writers take the ``str()`` path as before.

And the other way: ``dec_parse`` (``dec_from_text``, used by the MySQL rows decoder, PostgreSQL's numeric and
the wire format's reader) makes the Decimal of a plain text by filling the object; its specification is
``Decimal(text)``: the same value, text, tuple, hash and arithmetic, or None (the caller then calls
``Decimal(text)``)."""

from __future__ import annotations

import decimal
import json
import pickle
import random
import sys
from decimal import Decimal

import pytest

from capturer.model import encode, wire

_fastrows = pytest.importorskip("capturer._fastrows")
CAP = 160  # DEC_TEXT_CAP (fastrows.h)


def _json_rule(d: Decimal) -> str:
    """The JSON writer's text: plain unless str() has an exponent beyond +/-20000 (json.c)."""
    s = str(d)
    if "E" in s and -20000 <= int(s.split("E")[1]) <= 20000:
        return format(d, "f")
    return s


def _random_decimal(rng: random.Random) -> Decimal:
    digits = rng.choice([1, 1, 2, 5, 18, 19, 20, 38, 39, 57, 65, 76, 77, 100])
    coef = rng.randrange(10 ** (digits - 1) if digits > 1 else 0, 10 ** digits)
    if rng.random() < 0.05:
        coef = 0
    exp = rng.choice([0, rng.randrange(-12, 4), rng.randrange(-80, 80), rng.randrange(-30000, 30000)])
    return Decimal((rng.random() < 0.4, tuple(int(c) for c in str(coef)), exp))


def test_the_c_writer_is_on_for_this_python() -> None:
    # CPython's _decimal: decimal.c's layout check and self-test pass (off, every writer would use str())
    if not hasattr(decimal, "__libmpdec_version__"):
        pytest.skip("decimal is not CPython's C module here")
    texts, made = _fastrows.dec_fast()
    assert texts is True
    if sys.version_info < (3, 12):  # (objects are filled in as CPython 3.11 does: off from 3.12 on)
        assert made is True


def test_the_checks_at_import_never_fail_it() -> None:
    # the import-time checks ran their arithmetic in the importer's context, so a context that traps Inexact
    # (common in money code) made `import capturer._fastrows` raise; a changed context only turns paths off
    import subprocess

    prog = ("import decimal; c = decimal.getcontext(); c.traps[decimal.Inexact] = c.traps[decimal.Rounded] = True; "
            "c.prec = 10; c.Emax = 30; import capturer._fastrows as f; "
            "print(f.dec_fast(), c.flags[decimal.Inexact], c.flags[decimal.Rounded])")
    out = subprocess.run([sys.executable, "-c", prog], capture_output=True, text=True, check=True).stdout.strip()
    assert out.endswith("False False"), out  # (and the importer's flags untouched)
    assert out.startswith("(True, True)" if sys.version_info < (3, 12) else "(True, False)"), out
    prog = "import decimal; decimal.getcontext().capitals = 0; import capturer._fastrows as f; print(f.dec_fast())"
    out = subprocess.run([sys.executable, "-c", prog], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "(False, False)", out  # (str() would write "e" there: the C texts are off, not different)


def test_text_equals_str_and_format_on_random_decimals() -> None:
    rng = random.Random(20261129)
    written = 0
    for _ in range(30_000):
        d = _random_decimal(rng)
        for mode, want in ((0, str(d)), (1, format(d, "f")), (2, _json_rule(d))):
            got = _fastrows.dec_text(d, mode)
            if got is None:
                assert len(want) > CAP - 30, (d, mode, want)  # only what does not fit its buffer
            else:
                assert got == want, (d, mode)
                written += 1
    assert written > 60_000  # (most are written by C, not handed back)


def test_edges() -> None:
    for s in ["0", "-0", "0E+2", "-0E+3", "0E-5", "-0.00", "1E-7", "0.000001", "1E+2", "1.5E+3",
              "9999999999999999999", "10000000000000000000", "-1E-20", "4.2E-30001", "1E+25000",
              "0.1000000000000000000", "12345678901234567890.1234567890123456789"]:
        d = Decimal(s)
        assert _fastrows.dec_text(d, 0) in (str(d), None)
        assert _fastrows.dec_text(d, 0) is not None or len(str(d)) > CAP - 30
        assert _fastrows.dec_text(d, 1) in (format(d, "f"), None)
        assert _fastrows.dec_text(d, 2) == _json_rule(d) or len(_json_rule(d)) > CAP - 30


class _Sub(Decimal):
    def __str__(self) -> str:
        return "sub"


@pytest.mark.parametrize("v", [Decimal("NaN"), Decimal("-Infinity"), Decimal("sNaN"), _Sub("1.5"), 1.5, "1.5"])
def test_what_it_leaves_to_str(v: object) -> None:
    assert all(_fastrows.dec_text(v, m) is None for m in range(3))


def test_the_writers_give_the_python_paths_text() -> None:
    rng = random.Random(7)
    values = [_random_decimal(rng) for _ in range(3000)] + [Decimal("1E+25000"), Decimal("-0"), Decimal("NaN")]
    # the JSON writer (file lines, Kafka json) against the Python path
    for v in values:
        got = _fastrows.json_dumps({"v": v}, encode._fallback, None, False, False, None)
        assert got == json.dumps({"v": v}, ensure_ascii=False, default=encode._fallback), v
    # the wire format (backlog, agents, sender processes): the same bytes as the msgpack path, read back equal
    finite = [v for v in values if v.is_finite()]
    assert wire.unpackb(wire.packb(finite)) == finite
    # SQL literals: format(d, "f"), as pymysql writes a Decimal
    lits = _fastrows.sql_literals(finite, False, lambda x: "FALLBACK")
    assert list(lits) == [format(v, "f") for v in finite]


def _random_text(rng: random.Random) -> str:
    intg = "".join(rng.choice("0123456789") for _ in range(rng.choice([0, 1, 1, 3, 9, 19, 20, 38, 65])))
    frac = "".join(rng.choice("0123456789") for _ in range(rng.choice([0, 0, 1, 2, 9, 19, 30])))
    text = (rng.choice(["", "", "-"]) + intg + (rng.choice([".", "."]) + frac if frac or rng.random() < 0.2 else ""))
    if rng.random() < 0.1:  # forms left to Decimal(text), and texts that are not numbers
        text = rng.choice(["+1", " 1", "1_0", "1E5", "1e-3", "NaN", "-Inf", "", "-", ".", "1.2.3", "--1", "1-",
                           "0x10", "\u0661", "9" * 77, "0." + "0" * 100 + "1" * 77])
    return text


def _outcome(op: object, x: Decimal) -> object:
    try:
        return op(x)  # type: ignore[operator]
    except decimal.DecimalException as e:
        return type(e)


def test_parse_equals_decimal_of_the_text() -> None:
    if not _fastrows.dec_fast()[1]:
        pytest.skip("Decimals are not made by the C module on this Python")
    rng = random.Random(1129)
    made = 0
    for _ in range(30_000):
        text = _random_text(rng)
        d = _fastrows.dec_parse(text)
        try:
            ref = Decimal(text)
        except decimal.InvalidOperation:
            assert d is None, text
            continue
        if d is None:
            significant = text.lstrip("-").replace(".", "").lstrip("0")
            assert not (set(text) <= set("-.0123456789") and text.count("-") <= 1 and text.find("-") <= 0
                        and len(significant) <= 76 and any(c.isdigit() for c in text)), text
            continue
        made += 1
        assert type(d) is Decimal
        assert str(d) == str(ref) and d.as_tuple() == ref.as_tuple() and d == ref and hash(d) == hash(ref), text
        for op in (lambda x: x + x, lambda x: x * 3 - ref, lambda x: str(x.quantize(Decimal("0.1"))), lambda x: -x,
                   lambda x: x.sqrt() if x >= 0 else x.copy_abs(), lambda x: x.to_integral_value()):
            assert _outcome(op, d) == _outcome(op, ref), text
        assert pickle.loads(pickle.dumps(d)) == ref
        assert _fastrows.dec_text(d, 0) in (str(ref), None)
    assert made > 20_000


def test_the_applier_makes_the_same_decimals() -> None:
    # kafka_untype (the applier's typed columns) takes dec_from_text for a Decimal column: Decimal(text)'s
    # value, or the text kept where Decimal refuses it, exactly as the Python path (_untype_py)
    from capturer.apply import regroup

    rng = random.Random(5)
    convs = (("d", Decimal, ArithmeticError),)
    for _ in range(5000):
        text = _random_text(rng) if rng.random() < 0.9 else rng.choice(["١٢", "1E+3", "NaN", "abc", "-"])
        a, b = {"d": text}, {"d": text}
        regroup._untype_py(a, convs, frozenset())
        _fastrows.kafka_untype(b, convs, frozenset())
        assert type(a["d"]) is type(b["d"]) and str(a["d"]) == str(b["d"]), text
        if isinstance(a["d"], Decimal):
            assert a["d"].as_tuple() == b["d"].as_tuple()
