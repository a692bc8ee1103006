"""Bad input, end to end through the real CLI (``python -m capturer``).

Tables of hostile input, by category:

1. config files (``config.cfg``, ``senderConfig.cfg``)
2. filter rules (``filter_rule.txt``), code injection included
3. checkpoint files
4. command-line arguments
5. raw HTTP requests to the status port of a running capturer
6. hostile identifiers and values in a real MariaDB source, through the file sender

A refused start must exit with the code the README documents (2: "bad
configuration or checkpoint (nothing was started)"; argparse's usage errors are
2 as well), name the file and the line/key at fault, print no traceback and no
password, write nothing (every file under the case's directory is compared
byte for byte before and after), and never connect to the source: its region
points at a listening "sentinel" socket that must see no connection.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from helpers import ROOT, CapturerProcess, checkpoint_covers, read_lines, start_servers, wait_for

pytestmark = pytest.mark.integration

# Every config carries this password: '%' (interpolation), quotes, a backslash,
# '#' and ';' (comment starters), '=' and ':' (key separators). "s3cr" is in no
# other text, and no escaping (repr, JSON) changes it.
PASSWORD = "P%s3cr'et\"\\#;=:x"
SECRET_MARK = "s3cr"
TOKEN = "tok-9f2c"


# --- a sandbox per case -------------------------------------------------------


@dataclass
class Env:
    tmp: Path
    sentinel: socket.socket  # the region's "server": must never see a connection
    held: list[socket.socket] = field(default_factory=list)  # other sockets a case keeps open

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

    @property
    def region_port(self) -> int:
        return int(self.sentinel.getsockname()[1])

    def edit(self, path: Path, old: str, new: str) -> None:
        text = path.read_text()
        assert old in text, f"{old!r} not in {path}"
        path.write_text(text.replace(old, new, 1))

    def line_of(self, path: Path, needle: str) -> int:
        for i, line in enumerate(path.read_text().splitlines(), 1):
            if needle in line:
                return i
        raise AssertionError(f"{needle!r} not in {path}")

    def connected(self) -> bool:
        self.sentinel.setblocking(False)
        try:
            conn, _ = self.sentinel.accept()
        except BlockingIOError:
            return False
        conn.close()
        return True


def make_env(tmp: Path) -> Env:
    sentinel = socket.socket()
    sentinel.bind(("127.0.0.1", 0))
    sentinel.listen(8)
    env = Env(tmp, sentinel)
    env.cfg.write_text(
        "[global]\n"
        f"binlogCheckPointPath={env.cp}\n"
        f"senderConfig={env.snd}\n"
        f"filterRuleDict={env.flt}\n"
        "httpPort=0\n"
        "checkpointInterval=0.5\n"
        "[region:r1]\n"
        "type=mysql\n"
        "host=127.0.0.1\n"
        f"port={env.region_port}\n"
        "user=capturer\n"
        f"password={PASSWORD}\n"
        "server_id=801\n"
        "connect_timeout=1\n"
    )
    env.snd.write_text(f"[global]\ntype=local\n[local]\nfilepath={tmp / 'out' / 'changes.jsonl'}\n")
    env.flt.write_text("")
    return env


@pytest.fixture
def env(tmp_path: Path) -> Iterator[Env]:
    e = make_env(tmp_path)
    yield e
    for s in [e.sentinel, *e.held]:
        s.close()


def run_cli(*args: str, cwd: Path, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONIOENCODING="utf-8")
    return subprocess.run([sys.executable, "-m", "capturer", *args], capture_output=True, text=True,
                          encoding="utf-8", errors="replace", env=env, cwd=str(cwd), timeout=timeout)


def tree(root: Path) -> dict[str, Any]:
    """Every entry under root: file bytes, 'dir', or a symlink's target."""
    out: dict[str, Any] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            rel = str(p.relative_to(root))
            if p.is_symlink():
                out[rel] = ("link", os.readlink(p))
            elif p.is_dir():
                out[rel] = "dir"
            else:
                out[rel] = p.read_bytes()
    return out


def assert_refused(env: Env, argv: list[str], code: int, needles: list[str]) -> subprocess.CompletedProcess[str]:
    before = tree(env.tmp)
    # cwd is the sandbox: a stray write to a relative path would show up in tree()
    r = run_cli(*argv, cwd=env.tmp)
    both = r.stdout + r.stderr
    assert r.returncode == code, f"exit {r.returncode}, expected {code}:\n{both}"
    for n in needles:
        assert n in r.stderr, f"{n!r} not in stderr:\n{r.stderr}"
    assert "Traceback" not in both, both
    assert SECRET_MARK not in both, f"the password was printed:\n{both}"
    last = r.stderr.strip().splitlines()[-1]
    assert len(last) < 1000, f"an unreadable {len(last)}-character message"
    assert tree(env.tmp) == before, "a refused start wrote or changed a file"
    assert not env.connected(), "a refused start connected to the source"
    return r


@dataclass(frozen=True)
class Case:
    id: str
    setup: Callable[[Env], Any]  # returns argv (a list) when not the default
    needles: Callable[[Env], list[str]]
    code: int = 2  # README: 2 = bad configuration or checkpoint, nothing started


def params(cases: list[Case]) -> list[Any]:
    return [pytest.param(c, id=c.id) for c in cases]


def run_case(case: Case, env: Env) -> None:
    argv = case.setup(env)
    if not isinstance(argv, list):
        argv = ["--config", str(env.cfg)]
    assert_refused(env, argv, case.code, case.needles(env))


# --- 1. config files ------------------------------------------------------------


def _listening_port(env: Env) -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(1)
    env.held.append(s)
    return int(s.getsockname()[1])


def _set(env: Env, old: str, new: str, path: str = "cfg") -> None:
    env.edit(getattr(env, path), old, new)


CONFIG_CASES = [
    Case("unknown-global-key",
         lambda e: _set(e, "httpPort=0\n", "httpPort=0\ncheckpointIntervall=3\n"),
         lambda e: [f"{e.cfg}:6: [global] checkpointIntervall: unknown key 'checkpointIntervall'"]),
    Case("bad-int",
         lambda e: _set(e, "httpPort=0", "httpPort=80x"),
         lambda e: [f"{e.cfg}:5: [global] httpPort: bad value '80x': expected an integer"]),
    Case("int-in-arabic-indic-digits",  # int() would read it as 33
         lambda e: _set(e, "httpPort=0", "httpPort=\u0663\u0663"),
         lambda e: [f"{e.cfg}:5: [global] httpPort: bad value '\u0663\u0663': expected an integer"]),
    Case("int-with-underscore",  # int() would read it as 801
         lambda e: _set(e, "server_id=801", "server_id=8_01"),
         lambda e: [f"{e.cfg}:13: [region:r1] server_id: bad value '8_01'"]),
    Case("int-5000-digits",
         lambda e: _set(e, "httpPort=0", "httpPort=" + "9" * 5000),
         lambda e: [f"{e.cfg}:5: [global] httpPort: bad value '999", "expected an integer in [0, 65535]"]),
    Case("float-nan",
         lambda e: _set(e, "checkpointInterval=0.5", "checkpointInterval=nan"),
         lambda e: [f"{e.cfg}:6: [global] checkpointInterval: bad value 'nan'"]),
    Case("float-out-of-range",
         lambda e: _set(e, "checkpointInterval=0.5", "checkpointInterval=0"),
         lambda e: [f"{e.cfg}:6: [global] checkpointInterval: bad value '0': expected a number in [0.1, 3600]"]),
    Case("missing-global-section",
         lambda e: _set(e, "[global]\n", ""),
         lambda e: [f"{e.cfg}:1: key 'binlogCheckPointPath' outside any [section]"]),
    Case("empty-file",
         lambda e: e.cfg.write_text(""),
         lambda e: [f"{e.cfg}: missing section [global]"]),
    Case("duplicate-region",
         lambda e: e.cfg.write_text(e.cfg.read_text() + "[region:r1]\nhost=h\n"),
         lambda e: [f"{e.cfg}:15: section [region:r1] appears twice (first on line 7)"]),
    Case("two-regions-same-server",
         lambda e: e.cfg.write_text(e.cfg.read_text() + f"[region:r2]\nhost=127.0.0.1\nport={e.region_port}\n"
                                    "user=u\nserver_id=2\n"),
         lambda e: [f"{e.cfg}: regions [region:r1] and [region:r2] read the same server 127.0.0.1:{e.region_port}"]),
    Case("region-name-with-slash",
         lambda e: _set(e, "[region:r1]", "[region:r/1]"),
         lambda e: [f"{e.cfg}:7: region name 'r/1' must be 1-64 of"]),
    Case("region-name-65-chars",
         lambda e: _set(e, "[region:r1]", "[region:" + "r" * 65 + "]"),
         lambda e: [f"{e.cfg}:7: region name '{'r' * 65}'"]),
    Case("region-type-unknown",
         lambda e: _set(e, "type=mysql", "type=oracle"),
         lambda e: [f"{e.cfg}:8: [region:r1] type: bad value 'oracle': expected one of mysql, mariadb, baikaldb"]),
    Case("password-line-without-equals",  # the message must not echo the line: it holds the password
         lambda e: _set(e, "password=", "password "),
         lambda e: [f"{e.cfg}:12: expected 'key = value'"]),
    Case("password-outside-any-section",
         lambda e: e.cfg.write_text(f"password={PASSWORD}\n" + e.cfg.read_text()),
         lambda e: [f"{e.cfg}:1: key 'password' outside any [section]"]),
    Case("file-is-a-symlink-loop",
         lambda e: _none(e.cfg.unlink(), e.cfg.symlink_to(e.cfg)),
         lambda e: [f"{e.cfg}: cannot read file: Too many levels of symbolic links"]),
    Case("file-is-a-directory",
         lambda e: (e.tmp / "conf.d").mkdir() or ["--config", str(e.tmp / "conf.d")],
         lambda e: [f"{e.tmp / 'conf.d'}: cannot read file: Is a directory"]),
    Case("non-utf8-byte",
         lambda e: e.cfg.write_bytes(e.cfg.read_bytes().replace(b"user=capturer", b"user=caf\xe9")),
         lambda e: [f"{e.cfg}:11: byte 0xe9 at column 9 is not UTF-8"]),
    Case("nul-byte",
         lambda e: e.cfg.write_bytes(e.cfg.read_bytes().replace(b"user=capturer", b"user=cap\x00turer")),
         lambda e: [f"{e.cfg}:11: NUL byte in the file"]),
    Case("utf16-file",
         lambda e: e.cfg.write_bytes(e.cfg.read_text().encode("utf-16")),
         lambda e: [f"{e.cfg}:1: byte 0xff at column 1 is not UTF-8"]),
    Case("sender-non-utf8-byte",
         lambda e: e.snd.write_bytes(b"[global]\ntype=loc\xffal\n"),
         lambda e: [f"{e.snd}:2: byte 0xff at column 9 is not UTF-8"]),
    Case("sender-listed-twice",
         lambda e: _set(e, "type=local", "type=local, local", "snd"),
         lambda e: [f"{e.snd}:2: [global] type: a sender is listed twice"]),
    Case("sender-type-empty",
         lambda e: _set(e, "type=local", "type= , ", "snd"),
         lambda e: [f"{e.snd}:2: [global] type: type lists no sender"]),
    Case("sender-file-missing",
         lambda e: _set(e, f"senderConfig={e.snd}", f"senderConfig={e.tmp / 'nope.cfg'}"),
         lambda e: [f"{e.tmp / 'nope.cfg'}: file not found"]),
    Case("sender-bad-int",
         lambda e: e.snd.write_text(e.snd.read_text() + "rotate_mb=big\n"),
         lambda e: [f"{e.snd}:5: [local] rotate_mb: bad value 'big': expected an integer"]),
    Case("sender-bad-bool",
         lambda e: e.snd.write_text(e.snd.read_text() + "fsync=maybe\n"),
         lambda e: [f"{e.snd}:5: [local] fsync: bad value 'maybe': expected true or false"]),
    Case("sender-password-line-without-equals",  # [mysql] is validated though not in type=
         lambda e: e.snd.write_text(e.snd.read_text() + f"[mysql]\nhost=h\nuser=u\npassword {PASSWORD}\n"),
         lambda e: [f"{e.snd}:8: expected 'key = value'"]),
    Case("status-port-in-use",
         lambda e: _set(e, "httpPort=0", f"httpPort={_listening_port(e)}"),
         lambda e: ["start-up failed: cannot serve the status port on 127.0.0.1:", "(httpHost, httpPort): "
                    "Address already in use", str(e.cfg)]),
    Case("status-host-not-an-address",
         lambda e: _set(e, "httpPort=0", "httpPort=0\nhttpHost=256.1.1.1"),
         lambda e: ["start-up failed: cannot serve the status port on 256.1.1.1:0 (httpHost, httpPort)", str(e.cfg)]),
]


@pytest.mark.parametrize("case", params(CONFIG_CASES))
def test_bad_config_file(case: Case, env: Env) -> None:
    run_case(case, env)


# --- 2. filter rules -------------------------------------------------------------


def _rules(text: str) -> Callable[[Env], None]:
    def setup(e: Env) -> None:
        e.flt.write_text(text.replace("{tmp}", str(e.tmp)))
    return setup


def _flt(line: int, *rest: str) -> Callable[[Env], list[str]]:
    return lambda e: [f"{e.flt}:{line}: {rest[0]}", *rest[1:]]


FILTER_CASES = [
    Case("import-os-system",  # would create PWNED in the sandbox if it were ever evaluated
         _rules("include d.*\nd\tid\t==\t__import__('os').system('touch {tmp}/PWNED')\n"),
         _flt(2, "value \"__import__('os').system(", "is not a literal")),
    Case("dunder-subclasses-escape",
         _rules("d\tid\t==\t().__class__.__bases__[0].__subclasses__()\n"), _flt(1, "value", "is not a literal")),
    Case("fstring-with-import",
         _rules("d\tid\t==\tf'{__import__(\"os\").getpid()}'\n"), _flt(1, "value", "is not a literal")),
    Case("open-etc-passwd",
         _rules("d\tname\tin\topen('/etc/passwd').read()\n"), _flt(1, "value", "is not a literal")),
    Case("exponent-bomb",
         _rules("d\tid\t==\t9**9**9**9\n"), _flt(1, "value '9**9**9**9' is not a literal")),
    Case("complex-number",  # compares false with every row: it would silently drop them all
         _rules("d\tid\t>\t1+2j\n"), _flt(1, "value '1+2j' is not a literal")),
    Case("dict-literal",
         _rules("d\tid\t==\t{'a': 1}\n"), _flt(1, "value \"{'a': 1}\" is not a literal")),
    Case("operator-like",
         _rules("d\tname\tLIKE\t'a%'\n"), _flt(1, "unknown operator 'LIKE'; use one of ==, !=")),
    Case("operator-triple-equals",
         _rules("d\tid\t===\t1\n"), _flt(1, "unknown operator '==='")),
    Case("sql-statement-line",
         _rules("# rules\ninclude d.*\nselect * from d.t; drop table d.t\n"),
         _flt(3, "expected 'include PATTERN', 'exclude PATTERN' or a TAB-separated row rule")),
    Case("regex-without-closing-slash",
         _rules("exclude /^abc\n"), _flt(1, "a regex must be written /like this/, got '/^abc'")),
    Case("text-after-quoted-table",
         _rules("include `a`.`b`c\n"), _flt(1, "unexpected text after the table")),
    Case("empty-database",
         _rules("include .t\n"), _flt(1, "expected db.table, got '.t'")),
    Case("five-tab-fields",
         _rules("d\tid\t==\t1\textra\n"), _flt(1, "a row rule has 4 TAB-separated fields db, field, op, value; got 5")),
    Case("not-in-scalar",
         _rules("d\tid\tnot in\t5\n"), _flt(1, "'not in' needs a list")),
    Case("empty-field",
         _rules("d\t\t==\t1\n"), _flt(1, "row rule needs a db and a field")),
    Case("literal-nested-200k-deep",  # refused, with a short message (not the 400 KB line)
         _rules("d\tid\tin\t" + "[" * 200_000 + "]" * 200_000 + "\n"), _flt(1, "value '[[[", "is not a literal")),
    Case("non-utf8-byte",
         lambda e: e.flt.write_bytes(b"include d.*\ninclude caf\xe9.*\n"),
         _flt(2, "byte 0xe9 at column 12 is not UTF-8")),
    Case("nul-byte",
         lambda e: e.flt.write_bytes(b"include d\x00.*\n"),
         _flt(1, "NUL byte in the file")),
    Case("file-is-a-directory",
         lambda e: _none(e.flt.unlink(), e.flt.mkdir()),
         lambda e: [f"{e.flt}: cannot read filter rule file (filterRuleDict): Is a directory"]),
    Case("file-missing",
         lambda e: e.flt.unlink(),
         lambda e: [f"{e.flt}: filter rule file (filterRuleDict) not found"]),
]


@pytest.mark.parametrize("case", params(FILTER_CASES))
def test_bad_filter_rules(case: Case, env: Env) -> None:
    run_case(case, env)
    assert not (env.tmp / "PWNED").exists()


# --- 3. checkpoint files -----------------------------------------------------------

GOOD_CP = ('{"version": 1, "commit_ts": 470633843713900544, "commit_time": "2026-11-22T05:33:56.726000+00:00", '
           '"regions": {"r1": {"file": "mariadb-bin.000001", "pos": 5710, "gtid": "0-1-24"}}}')


def _none(*_done: object) -> None:
    """A set-up step made of several calls (their results are not needed)."""


def _cp(data: str | bytes) -> Callable[[Env], None]:
    def setup(e: Env) -> None:
        e.cp.write_bytes(data.encode() if isinstance(data, str) else data)
    return setup


def _pos(pos: str) -> str:
    return f'{{"version": 1, "commit_ts": 12, "regions": {{"r1": {pos}}}}}'


def _cpmsg(*needles: str) -> Callable[[Env], list[str]]:
    return lambda e: [f"start-up refused: {e.cp}: {needles[0]}", *needles[1:]]


CHECKPOINT_CASES = [
    Case("unconfigured-region", _cp(GOOD_CP.replace('"r1"', '"ghost"')),
         _cpmsg("names region(s) 'ghost' that", "does not configure", "delete its entry")),
    Case("truncated-json", _cp(GOOD_CP[:70]), _cpmsg("checkpoint is not valid JSON", "delete it")),
    Case("commit_ts-string", _cp('{"version": 1, "commit_ts": "12", "regions": {}}'),
         _cpmsg("'commit_ts' must be a non-negative 64-bit integer")),
    Case("commit_ts-bool", _cp('{"version": 1, "commit_ts": true, "regions": {}}'),
         _cpmsg("'commit_ts' must be a non-negative 64-bit integer")),
    Case("commit_ts-nan", _cp('{"version": 1, "commit_ts": NaN, "regions": {}}'),
         _cpmsg("'commit_ts' must be a non-negative 64-bit integer")),
    Case("commit_ts-2^64", _cp('{"version": 1, "commit_ts": 18446744073709551616, "regions": {}}'),
         _cpmsg("'commit_ts' must be a non-negative 64-bit integer")),
    Case("regions-a-list", _cp('{"version": 1, "commit_ts": 12, "regions": []}'),
         _cpmsg("'regions' must be an object")),
    Case("negative-pos", _cp(_pos('{"file": "mariadb-bin.000001", "pos": -5}')),
         _cpmsg("regions.r1: position.pos must be an integer >= 4, got -5")),
    Case("float-pos", _cp(_pos('{"file": "mariadb-bin.000001", "pos": 4.5}')),
         _cpmsg("regions.r1: position.pos must be an integer >= 4, got 4.5")),
    Case("file-a-number", _cp(_pos('{"file": 1, "pos": 4}')),
         _cpmsg("regions.r1: position.file must be a non-empty string, got 1")),
    Case("gtid-a-number", _cp(_pos('{"file": "mariadb-bin.000001", "pos": 4, "gtid": 7}')),
         _cpmsg("regions.r1: position.gtid must be a string, got 7")),
    Case("unknown-position-kind", _cp(_pos('{"kind": "postgres", "lsn": 5}')),
         _cpmsg("regions.r1: unknown position kind 'postgres'")),
    Case("baikaldb-position-for-mysql-region", _cp(_pos('{"kind": "baikaldb", "ts": 5}')),
         _cpmsg("checkpoint: regions.r1 is a baikaldb position, but [region:r1] is type=mysql")),
    Case("bad-snapshot-entry", _cp(_pos('{"file": "mariadb-bin.000001", "pos": 4, "snapshot": [{"x": 1}]}')),
         _cpmsg("regions.r1: bad snapshot entry")),
    Case("json-null", _cp("null"), _cpmsg("checkpoint must be a JSON object")),
    Case("duplicate-key", _cp('{"version": 1, "commit_ts": 12, "commit_ts": 99, "regions": {}}'),
         _cpmsg("checkpoint is not valid JSON (key 'commit_ts' appears twice)")),
    Case("binary-garbage", _cp(bytes(range(256)) * 4), _cpmsg("checkpoint is not valid JSON")),
    Case("utf16-encoded", _cp(GOOD_CP.encode("utf-16")), _cpmsg("checkpoint is not valid JSON")),
    Case("nested-100k-deep", _cp("[" * 100_000 + "]" * 100_000), _cpmsg("checkpoint is not valid JSON (nested too deeply)")),
    Case("a-directory", lambda e: e.cp.mkdir(), _cpmsg("cannot read checkpoint: [Errno 21] Is a directory")),
    Case("corrupt-lift-journal",  # the checkpoint's side file; the checkpoint itself is fine
         lambda e: _none(e.cp.write_text(GOOD_CP), (e.tmp / "checkpoint.json.lifts").write_text("garbage\n{}\n")),
         lambda e: [f"start-up refused: {e.cp}.lifts:1: corrupt lift journal"]),
]


@pytest.mark.parametrize("case", params(CHECKPOINT_CASES))
def test_bad_checkpoint(case: Case, env: Env) -> None:
    run_case(case, env)


# --- 4. command line ----------------------------------------------------------------

CLI_CASES = [
    Case("unknown-flag", lambda e: ["--config", str(e.cfg), "--frobnicate"],
         lambda e: ["capturer: error: unrecognized arguments: --frobnicate"]),
    Case("config-without-value", lambda e: ["--config"],
         lambda e: ["capturer: error: argument --config: expected one argument"]),
    Case("config-nonexistent", lambda e: ["--config", str(e.tmp / "nope.cfg")],
         lambda e: [f"config error: {e.tmp / 'nope.cfg'}: file not found"]),
    Case("default-config-missing", lambda e: ["--check"],  # cwd is the sandbox: no conf/ there
         lambda e: ["config error: conf/config.cfg: file not found"]),
    Case("config-empty-string", lambda e: ["--config", ""],
         lambda e: ["capturer: error: --config: empty path"]),
    Case("config-as-positional", lambda e: [str(e.cfg)],
         lambda e: ["capturer: error: unrecognized arguments:"]),
    Case("once-without-demo", lambda e: ["--config", str(e.cfg), "--once"],
         lambda e: ["capturer: error: --once and --demo-dir go with --demo"]),
    Case("demo-dir-without-demo", lambda e: ["--config", str(e.cfg), "--demo-dir", str(e.tmp / "demo")],
         lambda e: ["capturer: error: --once and --demo-dir go with --demo"]),
    Case("check-with-print-extras", lambda e: ["--config", str(e.cfg), "--check", "--print-extras"],
         lambda e: ["capturer: error: --demo, --check and --print-extras exclude each other"]),
    Case("demo-with-check", lambda e: ["--demo", "--check", "--demo-dir", str(e.tmp / "demo")],
         lambda e: ["capturer: error: --demo, --check and --print-extras exclude each other"]),
    Case("demo-unknown-kind", lambda e: ["--demo", "postgres"],
         lambda e: ["argument --demo: invalid choice: 'postgres'"]),
    Case("check-with-bad-config",
         lambda e: (_set(e, "httpPort=0", "httpPort=-1"), ["--config", str(e.cfg), "--check"])[1],
         lambda e: [f"{e.cfg}:5: [global] httpPort: bad value '-1': expected an integer in [0, 65535]"]),
    Case("snapshot-without-tables", lambda e: ["snapshot", "--config", str(e.cfg)],
         lambda e: ["capturer snapshot: error: the following arguments are required: tables"]),
    Case("snapshot-with-free-port-config", lambda e: ["snapshot", "d.t", "--config", str(e.cfg)],
         lambda e: ["the config has httpPort=0 (a free port chosen at start): give --url"]),
]


@pytest.mark.parametrize("case", params(CLI_CASES))
def test_bad_command_line(case: Case, env: Env) -> None:
    run_case(case, env)


def test_controls_a_good_start_does_write_and_connect(env: Env) -> None:
    """The checks above can fail: the same sandbox, valid, passes --check without a
    trace, and a real start connects to the source and writes its files. The
    checkpoint here is a valid one of the configured region."""
    r = run_cli("--config", str(env.cfg), "--check", cwd=env.tmp)
    assert r.returncode == 0 and r.stdout == "config OK\n", r.stdout + r.stderr
    assert SECRET_MARK not in r.stdout + r.stderr
    assert not env.connected() and not env.cp.exists()

    env.cp.write_text(GOOD_CP)
    proc = CapturerProcess(env.cfg, env.tmp / "capturer.log").start()
    try:
        proc.wait_ready(60)
        wait_for(env.connected, 20, "the capturer to connect to the source")
        wait_for(lambda: (env.tmp / "out" / "changes.jsonl").exists(), 20, "the output file")
    finally:
        code = proc.stop(60)
    log = (env.tmp / "capturer.log").read_text()
    assert code == 0, log
    assert "resuming from checkpoint" in log
    assert SECRET_MARK not in log and "Traceback" not in log


# --- 5. HTTP status port -------------------------------------------------------------


@dataclass
class Running:
    proc: CapturerProcess
    host: str
    port: int
    log: Path


@pytest.fixture(scope="module")
def running_capturer(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    """One capturer for every HTTP case; its region's port refuses connections
    (bound, not listening), so it runs (reconnecting) with no server."""
    tmp = tmp_path_factory.mktemp("http")
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))  # bound, never listening: connections are refused
    env = make_env(tmp)
    env.edit(env.cfg, f"port={env.region_port}", f"port={closed.getsockname()[1]}")
    env.sentinel.close()
    env.edit(env.cfg, "httpPort=0\n", f"httpPort=0\ncontrolToken={TOKEN}\n")
    log = tmp / "capturer.log"
    proc = CapturerProcess(env.cfg, log).start()
    try:
        proc.wait_ready(60)
        m = re.search(r"status on http://([^:/]+):(\d+)/status", log.read_text())
        assert m, log.read_text()
        yield Running(proc, m.group(1), int(m.group(2)), log)
    finally:
        assert proc.proc is not None
        if proc.proc.poll() is None:
            proc.proc.send_signal(signal.SIGTERM)
            proc.proc.wait(60)
        closed.close()


def exchange(port: int, data: bytes, timeout: float = 10, reset: bool = False) -> bytes:
    """Send raw bytes, half-close, read until the server closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        try:
            s.sendall(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server answered and closed before reading all of it
        if reset:  # go away at once with a RST, before the answer
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            return b""
        try:
            s.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        chunks = []
        while True:
            try:
                c = s.recv(65536)
            except ConnectionResetError:
                break
            if not c:
                break
            chunks.append(c)
    return b"".join(chunks)


def status_code(resp: bytes) -> int | None:
    m = re.match(rb"HTTP/1\.[01] (\d{3}) ", resp)
    if m:
        return int(m.group(1))
    m = re.search(rb"Error code: (\d{3})", resp)  # an error page without status line (HTTP/0.9 style)
    return int(m.group(1)) if m else None


def get_status(port: int, timeout: float = 5) -> tuple[int | None, float]:
    t = time.monotonic()
    resp = exchange(port, b"GET /status HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n", timeout=timeout)
    code = status_code(resp)
    if code == 200:
        json.loads(resp.split(b"\r\n\r\n", 1)[1])
    return code, time.monotonic() - t


AUTH = f"Authorization: Bearer {TOKEN}\r\n".encode()

HTTP_CASES = [
    ("request-line-1MB", b"GET /" + b"a" * (1 << 20) + b" HTTP/1.1\r\n\r\n", 414),
    ("header-1MB", b"GET /status HTTP/1.1\r\nX-Big: " + b"a" * (1 << 20) + b"\r\n\r\n", 431),
    ("500-headers", b"GET /status HTTP/1.1\r\n" + b"X-A: b\r\n" * 500 + b"\r\n", 431),
    ("malformed-request-line", b"GARBAGE\r\n\r\n", 400),
    ("four-word-request-line", b"GET /status HTTP/1.1 extra\r\n\r\n", 400),
    ("binary-garbage", bytes(range(256)) * 4, 400),
    ("tls-client-hello", b"\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03" + bytes(200), 400),
    ("http2-preface", b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", 505),
    ("path-traversal", b"GET /../../etc/passwd HTTP/1.1\r\n\r\n", 404),
    ("encoded-path-traversal", b"GET /%2e%2e/%2e%2e/etc/passwd HTTP/1.1\r\n\r\n", 404),
    ("absolute-uri-to-other-host", b"GET http://example.com/status HTTP/1.1\r\n\r\n", 404),
    ("unknown-path", b"GET /admin HTTP/1.1\r\n\r\n", 404),
    ("nul-byte-in-path", b"GET /sta\x00tus HTTP/1.1\r\n\r\n", 404),
    ("encoded-nul-in-path", b"GET /status%00.json HTTP/1.1\r\n\r\n", 404),
    ("post-to-status", b"POST /status HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}", 405),
    ("post-to-metrics", b"POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n", 405),
    ("put-status", b"PUT /status HTTP/1.1\r\nContent-Length: 0\r\n\r\n", 501),
    ("delete-health", b"DELETE /health HTTP/1.1\r\n\r\n", 501),
    ("connect-method", b"CONNECT example.com:443 HTTP/1.1\r\n\r\n", 501),
    ("snapshot-without-token", b"POST /snapshot HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}", 401),
    ("snapshot-wrong-token", b"POST /snapshot HTTP/1.1\r\nAuthorization: Bearer nope\r\nContent-Length: 2\r\n\r\n{}", 401),
    ("huge-content-length-no-body", b"POST /snapshot HTTP/1.1\r\n" + AUTH + b"Content-Length: 99999999999\r\n\r\n", 413),
    ("negative-content-length", b"POST /snapshot HTTP/1.1\r\n" + AUTH + b"Content-Length: -1\r\n\r\n", 400),
    ("non-numeric-content-length", b"POST /snapshot HTTP/1.1\r\n" + AUTH + b"Content-Length: abc\r\n\r\n", 400),
    ("snapshot-body-not-json", b"POST /snapshot HTTP/1.1\r\n" + AUTH + b"Content-Length: 4\r\n\r\n\xff\xfe\x00[", 400),
    ("pause-without-token", b"POST /senders/local/pause HTTP/1.1\r\nContent-Length: 0\r\n\r\n", 401),
    ("stop-wrong-token", b"POST /stop HTTP/1.1\r\nAuthorization: Bearer nope\r\nContent-Length: 0\r\n\r\n", 401),
    ("reload-token-in-query", b"POST /filter/reload?token=" + TOKEN.encode() + b" HTTP/1.1\r\nContent-Length: 0\r\n\r\n", 401),
    ("page-file-traversal", b"GET /ui/../capturer/status.py HTTP/1.1\r\n\r\n", 404),
    ("post-to-page", b"POST / HTTP/1.1\r\nContent-Length: 0\r\n\r\n", 405),
    ("client-resets-before-answer", b"GET /metrics HTTP/1.1\r\n\r\n", None),
]


@pytest.mark.parametrize("data,code", [pytest.param(d, c, id=i) for i, d, c in HTTP_CASES])
def test_http_bad_request(running_capturer: Running, data: bytes, code: int | None) -> None:
    t = time.monotonic()
    resp = exchange(running_capturer.port, data, reset=code is None)
    if code is not None:
        assert status_code(resp) == code, resp[:300]
        assert time.monotonic() - t < 5, "the refusal took too long"
        assert b"root:" not in resp and b"Traceback" not in resp
    # the server (and the capturer) carry on
    assert get_status(running_capturer.port)[0] == 200
    assert running_capturer.proc.proc is not None and running_capturer.proc.proc.poll() is None


def test_http_half_requests_do_not_block_other_clients(running_capturer: Running) -> None:
    port = running_capturer.port
    # slowloris: headers never finished; and a POST whose announced body never comes
    slow = socket.create_connection(("127.0.0.1", port))
    slow.sendall(b"GET /status HTTP/1.1\r\nHost: x\r\nX-Slow: ")
    body = socket.create_connection(("127.0.0.1", port))
    body.sendall(b"POST /snapshot HTTP/1.1\r\n" + AUTH + b"Content-Length: 60000\r\n\r\n{\"tab")
    try:
        for _ in range(3):
            code, took = get_status(port, timeout=5)
            assert code == 200 and took < 3, (code, took)
    finally:
        slow.close()
        body.close()


def test_http_binds_loopback_only(running_capturer: Running) -> None:
    assert running_capturer.host == "127.0.0.1"
    listening = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except FileNotFoundError:
            continue
        for row in rows:
            local, state = row.split()[1], row.split()[3]
            addr, port = local.rsplit(":", 1)
            if state == "0A" and int(port, 16) == running_capturer.port:
                listening.append(addr)
    assert listening == ["0100007F"], listening  # 127.0.0.1 only, no 0.0.0.0 and no IPv6


def test_http_capturer_survived_everything(running_capturer: Running) -> None:
    """After every case above: still running, /status answers 200, a clean stop
    exits 0, and the log holds no traceback (a client that went away is no error)."""
    proc = running_capturer.proc.proc
    assert proc is not None and proc.poll() is None
    code, _ = get_status(running_capturer.port)
    assert code == 200
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(60) == 0
    log = running_capturer.log.read_text()
    assert "Traceback" not in log and "ERROR capturer.ops.status" not in log, log[-3000:]
    assert TOKEN not in log and SECRET_MARK not in log


# --- 6. hostile identifiers and values in the source -----------------------------------

DB = "hostile`db \"1\" 'x'"


def q(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


LONG_TEXT = "é0123456789abcde" * 65536  # 1 MiB characters, 1.06 MB in UTF-8

# (id, table, column definitions, values (parameters of one INSERT, or raw SQL), expected row, b64 columns)
SOURCE_CASES: list[tuple[str, str, str, Any, dict[str, Any], set[str]]] = [
    ("table-name-backticks", "t`ick`", "id INT PRIMARY KEY, v INT", (1, 7), {"id": 1, "v": 7}, set()),
    ("table-name-quotes", "q'\"t", "id INT PRIMARY KEY, v INT", (1, 8), {"id": 1, "v": 8}, set()),
    ("table-name-spaces-and-sql", "my table; DROP TABLE x; --", "id INT PRIMARY KEY, v INT", (1, 9),
     {"id": 1, "v": 9}, set()),
    ("column-names-hostile", "cols",
     "id INT PRIMARY KEY, `c``1` INT, `c'2` INT, `c\"3` INT, `c 4` INT, `c.5` INT, `%s` INT",
     (1, 1, 2, 3, 4, 5, 6), {"id": 1, "c`1": 1, "c'2": 2, "c\"3": 3, "c 4": 4, "c.5": 5, "%s": 6}, set()),
    ("unicode-names", "таблица_表", "id INT PRIMARY KEY, `ключ_列` VARCHAR(20)", (1, "значение_値"),
     {"id": 1, "ключ_列": "значение_値"}, set()),
    ("64-char-names", "t" * 64, f"id INT PRIMARY KEY, `{'c' * 64}` INT", (1, 64), {"id": 1, "c" * 64: 64}, set()),
    ("value-nul-bytes", "nul", "id INT PRIMARY KEY, v TEXT", (1, "a\x00b\x00\x00c"),
     {"id": 1, "v": "a\x00b\x00\x00c"}, set()),
    ("value-quotes-backslashes", "quotes", "id INT PRIMARY KEY, v TEXT",
     (1, "'\"`\\; DROP TABLE x; -- \\' \\\\ \\n \n\r\t"),
     {"id": 1, "v": "'\"`\\; DROP TABLE x; -- \\' \\\\ \\n \n\r\t"}, set()),
    ("value-1MB-text", "longtext", "id INT PRIMARY KEY, v LONGTEXT", (1, LONG_TEXT), {"id": 1, "v": LONG_TEXT}, set()),
    ("value-emoji-utf8mb4", "emoji", "id INT PRIMARY KEY, v VARCHAR(20) CHARACTER SET utf8mb4",
     (1, "😀 ∑ 𝄞"), {"id": 1, "v": "😀 ∑ 𝄞"}, set()),
    # README, Known limits: latin1 is decoded as MySQL does (cp1252; its five
    # undefined bytes become U+0081, U+008D, U+008F, U+0090, U+009D)
    ("latin1-e-acute-0xE9", "latin1_e", "id INT PRIMARY KEY, v VARCHAR(20) CHARACTER SET latin1",
     "(1, _latin1 x'E9')", {"id": 1, "v": "é"}, set()),
    ("latin1-cp1252-bytes", "latin1_cp", "id INT PRIMARY KEY, v VARCHAR(20) CHARACTER SET latin1",
     "(1, _latin1 x'E980818D9F')", {"id": 1, "v": "é€\u0081\u008dŸ"}, set()),
    # README, JSON lines: binary strings as base64, their columns listed in "b64"
    ("binary-invalid-utf8", "bin", "id INT PRIMARY KEY, v VARBINARY(10)", "(1, x'FF00FE')",
     {"id": 1, "v": "/wD+"}, {"v"}),
]


@pytest.fixture(scope="module")
def hostile_capture(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """One MariaDB server and one capturer process (file sender) for every case:
    the capture user's password is PASSWORD."""
    tmp = tmp_path_factory.mktemp("hostile")
    [m] = start_servers(tmp, 1)
    try:
        c = m.connect()
        with c.cursor() as cur:
            cur.execute("CREATE USER 'hostile'@'127.0.0.1' IDENTIFIED BY %s", (PASSWORD,))
            cur.execute("GRANT REPLICATION SLAVE, BINLOG MONITOR, SELECT ON *.* TO 'hostile'@'127.0.0.1'")
        c.close()
        env = make_env(tmp)
        env.edit(env.cfg, f"port={env.region_port}", f"port={m.port}")
        env.sentinel.close()
        env.edit(env.cfg, "user=capturer", "user=hostile")
        env.edit(env.cfg, "connect_timeout=1", "heartbeat_ms=200")
        proc = CapturerProcess(env.cfg, tmp / "capturer.log").start()
        try:
            proc.wait_ready(60)
            c = m.connect()
            with c.cursor() as cur:
                cur.execute(f"CREATE DATABASE {q(DB)}")
                for _, table, cols, values, _, _ in SOURCE_CASES:
                    cur.execute(f"CREATE TABLE {q(DB)}.{q(table)} ({cols})")
                    if isinstance(values, str):
                        cur.execute(f"INSERT INTO {q(DB)}.{q(table)} VALUES {values}")
                    else:
                        marks = ", ".join(["%s"] * len(values))
                        cur.execute(f"INSERT INTO {q(DB)}.{q(table)} VALUES ({marks})", values)
            c.close()
            wait_for(lambda: checkpoint_covers(tmp, [m]), 60, "the checkpoint to cover every insert")
        finally:
            code = proc.stop(60)
        yield {"code": code, "lines": read_lines(tmp), "log": (tmp / "capturer.log").read_text()}
    finally:
        m.stop()


@pytest.mark.parametrize("table,expected,b64", [pytest.param(t, e, b, id=i) for i, t, _, _, e, b in SOURCE_CASES])
def test_hostile_source_rows_arrive_exactly(hostile_capture: dict[str, Any], table: str,
                                           expected: dict[str, Any], b64: set[str]) -> None:
    assert hostile_capture["code"] == 0, hostile_capture["log"][-3000:]
    rows = [x for x in hostile_capture["lines"] if x["op"] == "insert" and x["table"] == table]
    assert len(rows) == 1, [x["table"] for x in hostile_capture["lines"]]
    row = rows[0]
    assert row["db"] == DB
    assert row["after"] == expected
    assert set(row.get("b64") or ()) == b64
    ddl = [x for x in hostile_capture["lines"] if x["op"] == "ddl" and x["table"] == table]
    assert len(ddl) == 1 and ddl[0]["db"] == DB


def test_hostile_source_log_is_clean(hostile_capture: dict[str, Any]) -> None:
    log = hostile_capture["log"]
    assert SECRET_MARK not in log, "the source password was logged"
    assert "Traceback" not in log and " ERROR " not in log, log[-3000:]
