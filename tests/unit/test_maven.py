"""capturer/util/maven.py, the Maven step the Delta and Kafka jars of the Spark sender and the devtools'
JVMs share: a fake ``mvn`` on PATH (a script that writes the jars it is told of into -DoutputDirectory and
counts its runs) stands in for Maven (the real one runs in the Spark integration tests)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from capturer.util.maven import maven_lib, stamp_of

FAKE = """#!/bin/sh
echo run >> "{runs}"
for a in "$@"; do case "$a" in -DoutputDirectory=*) out="${{a#-DoutputDirectory=}}";; esac; done
for j in {jars}; do echo jar > "$out/$j"; done
echo "$@" > "{args}"
exit {code}
"""


def fake_mvn(tmp: Path, monkeypatch: pytest.MonkeyPatch, jars: str, code: int = 0) -> Path:
    bindir = tmp / "bin"
    bindir.mkdir(exist_ok=True)
    mvn = bindir / "mvn"
    mvn.write_text(FAKE.format(runs=tmp / "runs", args=tmp / "args", jars=jars, code=code))
    mvn.chmod(mvn.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    return tmp / "runs"


def pom(tmp: Path, text: str = "<project/>") -> Path:
    p = tmp / "pom.xml"
    p.write_text(text)
    return p


def test_resolves_once_keeps_what_is_asked_and_resolves_again_for_another_pom(tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    runs = fake_mvn(tmp_path, monkeypatch, "a-1.0.jar b-2.0.jar other-3.jar")
    cache, props = tmp_path / "cache", {"a.version": "1.0"}
    lib = maven_lib(cache, pom(tmp_path), props, ("a-", "b-"), "the test's jars", keep_only=True,
                    flags=("-DincludeGroupIds=x",))
    assert lib == cache / "lib"
    assert sorted(p.name for p in lib.glob("*.jar")) == ["a-1.0.jar", "b-2.0.jar"]
    assert (lib / ".complete").read_text().strip() == stamp_of(pom(tmp_path), props)
    args = (tmp_path / "args").read_text().split()
    assert "-Da.version=1.0" in args and "-DincludeGroupIds=x" in args and "dependency:copy-dependencies" in args
    assert maven_lib(cache, pom(tmp_path), props, ("a-", "b-"), "the test's jars", keep_only=True) == lib
    assert runs.read_text().count("run") == 1  # the second call resolved nothing
    maven_lib(cache, pom(tmp_path), {"a.version": "1.1"}, ("a-",), "the test's jars")  # another version
    assert runs.read_text().count("run") == 2
    assert sorted(p.name for p in lib.glob("*.jar")) == ["a-1.0.jar", "b-2.0.jar", "other-3.jar"]  # (all kept)
    pom(tmp_path, "<project>edited</project>")
    maven_lib(cache, tmp_path / "pom.xml", {"a.version": "1.1"}, ("a-",), "the test's jars")
    assert runs.read_text().count("run") == 3


def test_a_jar_missing_or_maven_failing_leaves_no_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_mvn(tmp_path, monkeypatch, "a-1.0.jar")
    cache = tmp_path / "cache"
    with pytest.raises(RuntimeError, match="mvn could not resolve the test's jars"):
        maven_lib(cache, pom(tmp_path), {"v": "1"}, ("a-", "b-"), "the test's jars")
    assert not (cache / "lib").exists() and [p.name for p in cache.iterdir()] == [".lock"]
    fake_mvn(tmp_path, monkeypatch, "a-1.0.jar b-1.0.jar", code=1)
    with pytest.raises(RuntimeError, match="mvn could not resolve"):
        maven_lib(cache, pom(tmp_path), {"v": "1"}, ("a-", "b-"), "the test's jars")
    assert not (cache / "lib").exists()


def test_without_mvn_the_error_says_where_the_jars_go(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "nothing"))
    cache = tmp_path / "cache"
    with pytest.raises(RuntimeError) as exc:
        maven_lib(cache, pom(tmp_path), {"v": "1"}, ("a-",), "the test's jars", hint=" (put them into {lib}, "
                  "with a .complete file holding {stamp})")
    want = stamp_of(tmp_path / "pom.xml", {"v": "1"})
    assert str(exc.value) == (f"the test's jars are resolved with Maven, and mvn is not on PATH (put them into "
                              f"{cache / 'lib'}, with a .complete file holding {want})")
    (cache / "lib").mkdir()
    (cache / "lib" / ".complete").write_text(want + "\n")  # put there by hand: used as is
    assert maven_lib(cache, tmp_path / "pom.xml", {"v": "1"}, ("a-",), "the test's jars") == cache / "lib"
