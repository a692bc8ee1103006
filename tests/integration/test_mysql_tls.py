"""TLS to MySQL/MariaDB (issue 49, item 6): a source and a target that accept TLS
connections only (``require_secure_transport = ON``, a self-signed CA made here with
openssl), read and written with ``ssl_mode = verify_identity``: the region's binlog
stream and its queries, the snapshot's reader, the MySQL sender, ``verify`` and
``--check --connect``, through a ``kill -9``. A wrong CA and ``ssl_mode = disabled``
are clear errors naming the region or sender and the key.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import ROOT, CapturerProcess, checkpoint_covers, verify_equal, wait_for, write_config
from workload import SCHEMA, Workload, assert_target_equals_sources

from devtools.local_mariadb import MariaDBInstance

pytestmark = pytest.mark.integration


def openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def make_ca(d: Path, name: str) -> tuple[Path, Path]:
    key, crt = d / f"{name}.key", d / f"{name}.crt"
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", f"/CN={name}",
            "-keyout", str(key), "-out", str(crt))
    return crt, key


def make_cert(d: Path, name: str, ca: tuple[Path, Path], san: str) -> tuple[Path, Path]:
    key, csr, crt, ext = d / f"{name}.key", d / f"{name}.csr", d / f"{name}.crt", d / f"{name}.ext"
    ext.write_text(f"subjectAltName={san}\n")
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}", "-keyout", str(key), "-out", str(csr))
    openssl("x509", "-req", "-in", str(csr), "-CA", str(ca[0]), "-CAkey", str(ca[1]), "-CAcreateserial",
            "-days", "2", "-extfile", str(ext), "-out", str(crt))
    return crt, key


@pytest.fixture
def pki(tmp_path: Path) -> dict[str, Path]:
    d = tmp_path / "pki"
    d.mkdir()
    ca = make_ca(d, "ca")
    other = make_ca(d, "other-ca")
    srv = make_cert(d, "server", ca, "IP:127.0.0.1")
    wrong_name = make_cert(d, "elsewhere", ca, "DNS:db.example.org")
    return {"ca": ca[0], "other": other[0], "cert": srv[0], "key": srv[1], "wrong_name_cert": wrong_name[0],
            "wrong_name_key": wrong_name[1]}


def tls_only(base: Path, server_id: int, pki: dict[str, Path], binlog: bool = True,
             cert: str = "cert", key: str = "key") -> MariaDBInstance:
    return MariaDBInstance(base, server_id=server_id, binlog=binlog, extra={
        "ssl_ca": str(pki["ca"]), "ssl_cert": str(pki[cert]), "ssl_key": str(pki[key]),
        "require_secure_transport": "ON"}).start()


@pytest.fixture
def servers(tmp_path: Path, pki: dict[str, Path]) -> Iterator[tuple[MariaDBInstance, MariaDBInstance]]:
    src = tls_only(tmp_path / "src", 1, pki)
    src.create_capture_user()
    tgt = tls_only(tmp_path / "tgt", 99, pki, binlog=False)
    try:
        yield src, tgt
    finally:
        src.stop()
        tgt.stop()


def tls(mode: str, ca: Path) -> str:
    return f"ssl_mode={mode}\nssl_ca={ca}\n"


def senders(tmp: Path, tgt: MariaDBInstance, extra: str) -> str:
    return (f"[global]\ntype=local,mysql\n[local]\nfilepath={tmp / 'out' / 'changes.jsonl'}\n"
            f"[mysql]\nhost=127.0.0.1\nport={tgt.port}\nuser=root\npassword=\nthreadnum=4\n{extra}")


def check_connect(cfg: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "capturer", "--config", str(cfg), "--check", "--connect"],
                          capture_output=True, text=True, cwd=str(ROOT), timeout=120)


def test_a_tls_only_source_and_target_through_kill9(tmp_path: Path, servers: Any, pki: dict[str, Path]) -> None:
    src, tgt = servers
    src.execute(*SCHEMA)
    w = Workload(src, 1, 5)
    for _ in range(30):
        w.step()
    good = tls("verify_identity", pki["ca"])
    cfg = write_config(tmp_path, [src], senders=senders(tmp_path, tgt, good),
                       region_extra=good + "snapshot=initial\nsnapshot_chunk_rows=50\n")
    r = check_connect(cfg)
    assert r.returncode == 0, r.stdout + r.stderr
    log = tmp_path / "capturer.log"
    proc = CapturerProcess(cfg, log).start()
    proc.wait_ready()
    load = w.thread(3_000)
    time.sleep(3)
    proc.kill9()
    proc = CapturerProcess(cfg, log).start()
    proc.wait_ready()
    w.stop.set()
    load.join()
    wait_for(lambda: checkpoint_covers(tmp_path, [src]), 180, "catch-up over TLS")
    assert proc.stop() == 0
    assert w.txns > 30 and not w.errors
    assert_target_equals_sources([src], tgt)
    report = verify_equal(cfg, ["local", "mysql"])
    assert report["tables"]

    # the server really refuses clear text: ssl_mode = disabled is a clear error naming the setting
    plain = tmp_path / "plain"
    plain.mkdir()
    cfg2 = write_config(plain, [src], senders=senders(plain, tgt, "ssl_mode=disabled\n"),
                        region_extra="ssl_mode=disabled\n")
    r = check_connect(cfg2)
    assert r.returncode == 3, r.stdout + r.stderr
    assert r.stderr.count("accepts TLS connections only") == 2, r.stderr  # the region and the sender
    assert "region:r1" in r.stderr and "sender mysql" in r.stderr and "ssl_mode = disabled" in r.stderr, r.stderr


def test_a_wrong_ca_or_host_name_is_a_clear_error(tmp_path: Path, servers: Any, pki: dict[str, Path]) -> None:
    src, tgt = servers
    bad = tls("verify_ca", pki["other"])
    cfg = write_config(tmp_path, [src], senders=senders(tmp_path, tgt, bad), region_extra=bad)
    r = check_connect(cfg)
    assert r.returncode == 3, r.stdout + r.stderr
    err = r.stderr
    assert f"ssl_ca = {pki['other']}" in err and "region:r1" in err and "[mysql]" in err, err
    # a start refuses too (the region's error is fatal: retrying cannot help), naming the key
    log = tmp_path / "capturer.log"
    proc = CapturerProcess(cfg, log).start()
    assert proc.proc is not None and proc.proc.wait(120) == 1
    assert "not signed by ssl_ca" in log.read_text()
    assert "password" not in err.lower() or "***" in err


def test_verify_identity_checks_the_host_name(tmp_path: Path, pki: dict[str, Path]) -> None:
    """A certificate signed by the right CA for another host name: verify_ca accepts it,
    verify_identity refuses it, naming the difference."""
    src = tls_only(tmp_path / "src", 1, pki, cert="wrong_name_cert", key="wrong_name_key")
    try:
        src.create_capture_user()
        for mode, code in (("verify_ca", 0), ("verify_identity", 3)):
            d = tmp_path / mode
            d.mkdir()
            cfg = write_config(d, [src], region_extra=tls(mode, pki["ca"]))
            r = check_connect(cfg)
            assert r.returncode == code, (mode, r.stdout + r.stderr)
            if code:
                assert "does not name the host" in r.stderr, r.stderr
    finally:
        src.stop()
