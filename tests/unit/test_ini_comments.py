"""End-of-line comments and quoted values in the INI files (capturer/util/ini.py;
the rule is documented in docs/configuration.md, "Comments and quoting"):

* a line whose first non-blank character is ``#`` or ``;`` is a comment;
* a ``#`` or ``;`` that follows whitespace starts a comment (it and the whitespace
  before it are dropped);
* a ``#`` or ``;`` that follows no whitespace is part of the value (``pa#ss``);
* ``"..."`` keeps a value as written (``""`` is one ``"``), comment characters included;
* a value that still looks as if it carried a comment is a ConfigError naming file,
  line, section and key, and never echoes the value.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from capturer.app import load_config
from capturer.errors import ConfigError
from capturer.util.ini import parse_value, read_ini


def ini(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "x.cfg"
    p.write_text(text)
    return p


def value(tmp_path: Path, line: str, key: str = "k") -> str:
    return read_ini(ini(tmp_path, f"[s]\n{line}\n")).sections["s"].values[key].value


@pytest.mark.parametrize("line,expected", [
    ("k = capturer_pg_orders            # default: capturer_<region name>", "capturer_pg_orders"),
    ("k=capturer # the role", "capturer"),
    ("k = capturer\t# a tab before the comment", "capturer"),
    ("k = capturer ; a semicolon comment", "capturer"),
    ("k = capturer    ;", "capturer"),
    ("k = a b c   # words before the comment stay", "a b c"),
    ("k = # nothing but a comment", ""),
    ("k =", ""),
    ("k: capturer  # ':' as the separator", "capturer"),
])
def test_comment_after_whitespace_is_stripped(tmp_path: Path, line: str, expected: str) -> None:
    assert value(tmp_path, line) == expected


@pytest.mark.parametrize("line,expected", [
    ("k = pa#ss", "pa#ss"),
    ("k = a;b", "a;b"),
    ("k=#x", "#x"),  # right after the '=': no whitespace before it
    ("k = 10.0.0.1:9092;10.0.0.2:9092", "10.0.0.1:9092;10.0.0.2:9092"),
    ("k = value#", "value#"),
    ("k = x#y # and a comment", "x#y"),
    ("k = capturer.{db}.{table}", "capturer.{db}.{table}"),
])
def test_hash_inside_a_value_is_kept(tmp_path: Path, line: str, expected: str) -> None:
    assert value(tmp_path, line) == expected


def test_password_with_hash_and_other_specials_is_kept(tmp_path: Path) -> None:
    # the bad-input suite's password: '%', quotes, a backslash, '#', ';', '=', ':'
    password = "P%s3cr'et\"\\#;=:x"
    p = ini(tmp_path, f"[region:a]\nhost=h\nuser=u\npassword={password}\nserver_id=1\n")
    assert read_ini(p).sections["region:a"].values["password"].value == password
    (tmp_path / "senderConfig.cfg").write_text("[global]\ntype=local\n")
    cfgp = tmp_path / "config.cfg"
    cfgp.write_text("[global]\nsenderConfig=./senderConfig.cfg\n"
                    "[region:a]\nhost=h\nuser=u\npassword=pa#ss;word # the capture user's\nserver_id=1\n")
    cfg = load_config(cfgp, base_dir=tmp_path)
    assert cfg.regions[0].password == "pa#ss;word"  # type: ignore[union-attr]


@pytest.mark.parametrize("line,expected", [
    ('k = "pa #ss"', "pa #ss"),
    ('k = "pa #ss"   # a comment after the quotes', "pa #ss"),
    ('k = "  spaces kept  "', "  spaces kept  "),
    ('k = "say ""hi"""', 'say "hi"'),
    ('k = ""', ""),
    ('k = "a ; b" ; comment', "a ; b"),
    ('k = a"b"', 'a"b"'),  # quotes inside an unquoted value are literal
])
def test_quoted_values(tmp_path: Path, line: str, expected: str) -> None:
    assert value(tmp_path, line) == expected


def test_full_line_comments(tmp_path: Path) -> None:
    p = ini(tmp_path, "# a comment\n; another\n   # indented\n[s]\n# k = not a key\nk = v\n  ;x=y\n")
    sec = read_ini(p).sections["s"]
    assert {k: v.value for k, v in sec.values.items()} == {"k": "v"}
    assert sec.values["k"].line == 6


def test_comment_after_a_section_header(tmp_path: Path) -> None:
    p = ini(tmp_path, "[s]   # the section\nk = v\n[t] ; another\n")
    assert list(read_ini(p).sections) == ["s", "t"]
    with pytest.raises(ConfigError, match=r"x.cfg:1: malformed section header"):
        read_ini(ini(tmp_path, "[s]# no whitespace before the comment\n"))


@pytest.mark.parametrize("line,needle", [
    ("user = capturer# the role", "'#' followed by a space"),
    ("user = capturer; the role", "';' followed by a space"),
    ("user =# the role", "'#' followed by a space"),
    ('user = "capturer', "no closing '\"'"),
    ('user = "capturer" the role', "text after the closing '\"'"),
    ('user = "capturer"# the role', "text after the closing '\"'"),
])
def test_value_that_looks_like_it_carries_a_comment_is_an_error(tmp_path: Path, line: str, needle: str) -> None:
    p = ini(tmp_path, f"[global]\n\n[region:a]\nhost=h\n{line}\n")
    with pytest.raises(ConfigError) as ei:
        read_ini(p)
    msg = str(ei.value)
    # file and line, section and key, what is wrong, and how to say it instead
    prefix = f"{p}:5: [region:a] user: "
    assert msg.startswith(prefix), msg
    assert needle in msg, msg
    said = msg[len(prefix):]
    assert "the role" not in said and "capturer" not in said, f"the value was echoed: {msg}"


def test_error_never_echoes_a_password(tmp_path: Path) -> None:
    p = ini(tmp_path, "[region:a]\npassword = hunter2# s3cr\n")
    with pytest.raises(ConfigError) as ei:
        read_ini(p)
    assert str(ei.value).startswith(f"{p}:2: [region:a] password: ")
    said = str(ei.value)[len(f"{p}:2: [region:a] password: "):]
    assert "hunter2" not in said and "s3cr" not in said
    assert "double quotes" in str(ei.value)


def test_postgresql_example_of_the_docs_checks(tmp_path: Path) -> None:
    """The example that failed with "slot: bad value 'capturer_pg_orders   # default: ...'"."""
    (tmp_path / "senderConfig.cfg").write_text("[global]\ntype=local\n")
    cfgp = tmp_path / "config.cfg"
    cfgp.write_text(
        "[global]\nsenderConfig=./senderConfig.cfg\n"
        "[region:pg_orders]\ntype=postgresql\nhost=10.0.0.21\nport=5432\n"
        "user=capturer          # a role with REPLICATION\npassword=...\ndbname=orders\n"
        "slot=capturer_pg_orders            # default: capturer_<region name>\n"
        "publication=capturer_pg_orders     # default: capturer_<region name>\n"
        "create_publication=all             # no (default: it must exist) | all | schema.table,schema.table\n")
    r = load_config(cfgp, base_dir=tmp_path).regions[0]
    assert (r.user, r.slot, r.publication, r.create_publication) == (  # type: ignore[union-attr]
        "capturer", "capturer_pg_orders", "capturer_pg_orders", "all")


def test_parse_value_directly() -> None:
    assert parse_value("  v  # c") == "v"
    assert parse_value(' "v # c"') == "v # c"
    with pytest.raises(ValueError):
        parse_value(" v# c")
