"""The operator's view, used as a person would: the live status page in headless
Chromium (real page, real JavaScript, real polling), the control endpoints behind
the token, ``python -m capturer status``, the Grafana dashboard's queries, and a
capturer restart under the open page.

Two MariaDB regions under a steady workload feed two senders (local file and
MySQL). The screenshot is saved as a test artifact (tests/artifacts/status-page.png; the README's,
docs/status-page.png, is made by tests/screenshot.py).
"""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from browser import Browser, chromium_path
from helpers import ROOT, CapturerProcess, checkpoint_covers, wait_for, write_config
from workload import SCHEMA, Workload, assert_target_equals_sources, file_state_equals, rows_of

from devtools.local_mariadb import MariaDBInstance

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(chromium_path() is None, reason="chromium missing (tests/run.sh installs it)")]

TOKEN = "s3cret-Token-for-tests"
META_DB = "_cap%`meta"  # the MySQL sender's progress table for keyless tables, under a hostile name
ARTIFACTS = ROOT / "tests" / "artifacts"


class SteadyLoad:
    """A workload on every server, a transaction every few ms, until stopped."""

    def __init__(self, servers: list[MariaDBInstance]):
        self.loads = [Workload(m, i + 1, 70 + i) for i, m in enumerate(servers)]
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._run, args=(w,), daemon=True) for w in self.loads]
        for t in self.threads:
            t.start()

    def _run(self, w: Workload) -> None:
        try:
            while not self.stop.is_set():
                w.step()
                time.sleep(0.01)
        except BaseException as exc:
            w.errors.append(exc)

    def finish(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(30)
        for w in self.loads:
            assert not w.errors, w.errors


@contextlib.contextmanager
def capturer_under_load(cfg: Path, tmp: Path, servers: list[MariaDBInstance]) -> Iterator[CapturerProcess]:
    """The capturer as a process with a steady load on every server; on a clean exit
    of the block the load stops, the senders catch up, and the capturer stops with 0."""
    cap = CapturerProcess(cfg, tmp / "capturer.log").start()
    cap.wait_ready()
    load = SteadyLoad(servers)
    try:
        yield cap
        load.finish()
        wait_for(lambda: checkpoint_covers(tmp, servers), 120, "the senders to catch up")
        assert cap.stop() == 0
    finally:
        load.stop.set()
        if cap.proc is not None and cap.proc.poll() is None:
            cap.proc.kill()


def status(url: str) -> dict[str, Any]:
    return requests.get(url + "/status", timeout=10).json()


def post(url: str, path: str, token: str | None = TOKEN) -> requests.Response:
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    return requests.post(url + path, headers=headers, json={}, timeout=30)


def cell(b: Browser, table: str, name: str, col: str) -> str:
    return b.text(f'#{table} tr[data-name="{name}"] .{col}')


def number(text: str) -> float:
    t = text.replace(",", "").strip()
    return float(t) if re.fullmatch(r"[0-9.]+", t) else -1.0


@pytest.fixture
def setup(tmp_path: Path, two_servers: list[MariaDBInstance], target: MariaDBInstance) -> Iterator[dict[str, Any]]:
    for m in two_servers:
        m.execute(*SCHEMA)
    senders = (f"[global]\ntype=local,mysql\n[local]\nfilepath={tmp_path / 'out' / 'changes.jsonl'}\n"
               f"[mysql]\nhost=127.0.0.1\nport={target.port}\nuser=root\npassword=\nthreadnum=4\n"
               f"meta_database={META_DB}\nprocess=true\n")  # MySQL's work in a process of its own
    cfg = write_config(tmp_path, two_servers, senders=senders, filter_text="# nothing filtered\n",
                       extra_global=f"controlToken={TOKEN}\n")
    port = int(re.search(r"httpPort=(\d+)", cfg.read_text()).group(1))  # type: ignore[union-attr]
    yield {"cfg": cfg, "url": f"http://127.0.0.1:{port}", "tmp": tmp_path}


def test_status_page_live_pause_resume_restart(setup: dict[str, Any], two_servers: list[MariaDBInstance],
                                               target: MariaDBInstance) -> None:
    cfg, url, tmp = setup["cfg"], setup["url"], setup["tmp"]
    with capturer_under_load(cfg, tmp, two_servers) as cap, Browser(url + "/") as b:
        # 1. live values: both regions and both senders, numbers that move
        for table, name in (("regions", "r1"), ("regions", "r2"), ("senders", "local"), ("senders", "mysql")):
            b.wait(f'!!document.querySelector(\'#{table} tr[data-name="{name}"]\')', 30, f"{table} row {name}")
        b.wait("document.getElementById('conn').textContent === 'live'", 20, "the live badge")
        b.wait('document.querySelector(\'#regions tr[data-name="r1"] .c-state\').textContent === "streaming"',
               60, "r1 streaming")
        for name in ("local", "mysql"):
            b.wait(f"parseFloat(document.querySelector('#senders tr[data-name=\"{name}\"] .c-rate')"
                   ".textContent.replace(/,/g, '')) > 0", 60, f"a rows/s for sender {name}")
        rows0 = number(cell(b, "senders", "local", "c-rows"))
        cp0 = b.text("#cp-time")
        time.sleep(4)
        assert number(cell(b, "senders", "local", "c-rows")) > rows0 >= 0
        assert number(cell(b, "regions", "r2", "c-rows")) > 0
        assert b.text("#cp-time") != cp0, "the checkpoint shown does not move"
        assert b.js("document.querySelectorAll('#chart canvas').length") >= 1, "no throughput chart"
        assert b.js("document.querySelectorAll('#senders svg.spark polyline').length") == 2
        pid = status(url)["senders"]["mysql"]["process"]["pid"]
        assert pid and f"process {pid}" in cell(b, "senders", "mysql", "c-state"), "the sender's process not shown"
        assert "healthy" in b.text("#health")
        shot = b.screenshot(ARTIFACTS / "status-page.png")
        print(f"screenshot: {shot}")

        # 2. control calls without the token (or with a wrong one) are refused and change nothing
        for tok in (None, "wrong", TOKEN + "x", ""):
            r = post(url, "/senders/local/pause", tok)
            assert r.status_code == 401, (tok, r.status_code, r.text)
        assert post(url, "/stop", None).status_code == 401
        assert status(url)["senders"]["local"]["paused"] is False

        # 3. pause through the page: type the token, click the sender's Pause button
        b.type_into("#token", TOKEN)
        b.click('#senders tr[data-name="local"] button.pause-resume')
        b.wait('document.querySelector(\'#senders tr[data-name="local"] .c-state\').textContent.startsWith("paused")',
               20, "local shown paused")
        assert b.text('#senders tr[data-name="local"] button.pause-resume') == "Resume"
        wait_for(lambda: status(url)["senders"]["local"]["state"] == "paused", 20, "local paused")
        time.sleep(1.5)  # the checkpoint of the last batch acknowledged before the pause is written
        s1 = status(url)
        time.sleep(3)
        s2 = status(url)
        assert s2["senders"]["local"]["rows"] == s1["senders"]["local"]["rows"], "a paused sender sent rows"
        assert s2["senders"]["mysql"]["rows"] > s1["senders"]["mysql"]["rows"], "the other sender stopped too"
        # "every sender acknowledged up to" waits for the paused sender; its own position holds, the other's moves
        assert s2["checkpoint"]["commit_ts"] == s1["checkpoint"]["commit_ts"], "the checkpoint passed a paused sender"
        assert s2["senders"]["mysql"]["acked_ts"] > s2["checkpoint"]["commit_ts"]
        assert s2["checkpoint"]["senders"]["mysql"]["offset"] > s2["checkpoint"]["senders"]["local"]["offset"]
        assert s2["senders"]["local"]["queue_rows"] > 0 and s2["senders"]["local"]["stream_state"] == "paused"
        assert b.text("#held") == "nothing"  # a paused sender holds nobody back
        assert b.text('#senders tr[data-name="local"] .c-state').startswith("paused")
        health = requests.get(url + "/health", timeout=10).json()
        assert health["ok"] and "paused" in health["reason"] and "local" in health["reason"]
        metrics = requests.get(url + "/metrics", timeout=10).text
        assert 'capturer_sender_paused{sender="local"} 1.0' in metrics
        assert 'capturer_sender_paused{sender="mysql"} 0.0' in metrics
        # the terminal view says the same
        out = subprocess.run([sys.executable, "-m", "capturer", "status", "--url", url], cwd=ROOT,
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        lines = out.stdout.splitlines()
        assert any(ln.split()[:2] == ["local", "paused"] for ln in lines), out.stdout
        assert any(ln.split()[:2] == ["mysql", "live"] for ln in lines), out.stdout
        assert any(ln.split()[:3] == ["r1", "mysql", "streaming"] for ln in lines), out.stdout
        assert any(ln.split()[:1] == ["r2"] for ln in lines), out.stdout
        b.screenshot(ARTIFACTS / "status-page-paused.png")

        # 4. resume through the page
        b.click('#senders tr[data-name="local"] button.pause-resume')
        wait_for(lambda: not status(url)["senders"]["local"]["paused"], 20, "local resumed")
        wait_for(lambda: status(url)["senders"]["local"]["rows"] > s2["senders"]["local"]["rows"], 30,
                 "local sending again")
        b.wait('document.querySelector(\'#senders tr[data-name="local"] .c-state\').textContent === "live"',
               20, "local shown live")

        # 5. a table snapshot started from the page, its progress shown until done
        b.type_into("#snapshot-tables", "app.users")
        b.click("#snapshot")
        b.wait("document.getElementById('message').textContent.indexOf('snapshot app.users: done') >= 0", 30,
               "the snapshot accepted")
        for region in ("r1", "r2"):
            b.wait(f"(document.querySelector('#snapshots tr[data-name=\"{region} app.users\"] .badge') || {{}})"
                   ".textContent === 'done'", 120, f"{region}'s snapshot of app.users shown done")
        assert not b.js("document.getElementById('snapshots').hidden")

        # 5b. verify started from the page: its result per sender and table
        b.type_into("#verify-tables", "app.users")
        b.click("#verify")
        b.wait("document.getElementById('message').textContent.indexOf('verify: done') >= 0", 30, "verify accepted")
        b.wait("document.getElementById('verify-state').textContent.indexOf('last run') >= 0", 180,
               "the verify's result shown")
        for sender in ("local", "mysql"):
            badge = b.wait(f"(document.querySelector('#verify-results tr[data-name=\"{sender} app.users\"] .badge')"
                           " || {}).textContent", 30, f"{sender} app.users in the results")
            assert badge in ("equal", "not caught up"), badge  # a stream that moves: never "different"

        # 6. a graceful stop through the endpoint; the page says it lost the capturer
        started = status(url)["started_at"]
        assert post(url, "/stop").status_code == 202
        assert cap.proc is not None and cap.proc.wait(90) == 0
        b.wait("document.getElementById('conn').textContent.indexOf('unreachable') >= 0", 30,
               "the page noticing the capturer is gone")
        assert not b.js("document.getElementById('banner').hidden")
        # 7. ... and picks it up again after a restart, with counters from zero
        cap.start()
        cap.wait_ready()
        b.wait("document.getElementById('conn').textContent === 'live'", 60, "live again")
        wait_for(lambda: status(url)["started_at"] != started, 30, "a new process")
        b.wait("document.getElementById('banner').textContent.indexOf('restarted') >= 0", 30,
               "the restart banner")
        b.wait("parseFloat(document.querySelector('#senders tr[data-name=\"local\"] .c-rate')"
               ".textContent.replace(/,/g, '')) > 0", 60, "rows/s after the restart")
        assert not b.console, b.console  # no JavaScript error or CSP violation all along
        # and no failed load but the polls while the capturer was stopped
        assert all("ERR_CONNECTION_REFUSED" in n and re.search(r"/(status|health) *$", n) for n in b.network), \
                b.network
    # nothing lost while paused, stopped and restarted
    assert_target_equals_sources(two_servers, target)
    assert rows_of(target, META_DB, "applied"), "no progress of the keyless table in the meta database"
    file_state_equals(tmp, two_servers)


def test_filter_reload_and_dashboard_metrics(setup: dict[str, Any], two_servers: list[MariaDBInstance]) -> None:
    cfg, url, tmp = setup["cfg"], setup["url"], setup["tmp"]
    filt = tmp / "filter_rule.txt"
    cap = CapturerProcess(cfg, tmp / "capturer.log").start()
    cap.wait_ready()
    try:
        m1 = two_servers[0]
        m1.execute("INSERT INTO app.log VALUES ('before', 1)")
        wait_for(lambda: status(url)["senders"]["local"]["rows"] >= 1, 60, "the first row")
        # a broken file is refused, names file and line, and the old rules stay
        filt.write_text("# ok\nexclude app.log\nfrobnicate app.users\n")
        r = post(url, "/filter/reload")
        assert r.status_code == 400, r.text
        assert f"{filt}:3" in r.json()["error"], r.json()
        assert status(url)["filter"]["table_rules"] == 0
        m1.execute("INSERT INTO app.log VALUES ('still captured', 2)")
        wait_for(lambda: status(url)["senders"]["local"]["rows"] >= 2, 60, "the second row")
        # a good one applies from now on (the command line, as an operator would)
        filt.write_text("exclude app.log\n")
        out = subprocess.run([sys.executable, "-m", "capturer", "reload-filter", "--config", str(cfg)], cwd=ROOT,
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        assert json.loads(out.stdout)["table_rules"] == 1
        m1.execute("INSERT INTO app.log VALUES ('filtered out', 3)", "INSERT INTO app.pairs VALUES (1, 'a', 'after')")
        wait_for(lambda: status(url)["senders"]["local"]["rows"] >= 3, 60, "the pairs row")
        time.sleep(1)
        # without the token: refused
        bad = subprocess.run([sys.executable, "-m", "capturer", "pause", "local", "--url", url, "--token", "nope"],
                             cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert bad.returncode == 2 and "401" in bad.stderr, (bad.returncode, bad.stderr)
        assert post(url, "/senders/nosuch/pause").status_code == 404

        # a pause outlives a restart (stopped with the command line, as an operator would)
        def cli(*args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run([sys.executable, "-m", "capturer", *args, "--config", str(cfg)], cwd=ROOT,
                                  capture_output=True, text=True, timeout=60)

        assert cli("pause", "mysql").returncode == 0
        paused_file = tmp / "checkpoint.json.paused"
        assert paused_file.read_text().split() == ["mysql"]
        assert cli("stop").returncode == 0
        assert cap.proc is not None and cap.proc.wait(90) == 0
        m1.execute("INSERT INTO app.pairs VALUES (2, 'b', 'while stopped')")
        cap.start()
        cap.wait_ready()
        wait_for(lambda: status(url)["senders"]["mysql"]["state"] == "paused", 30, "mysql paused after the restart")
        wait_for(lambda: status(url)["senders"]["local"]["rows"] >= 1, 60, "local sending after the restart")
        time.sleep(1)
        assert status(url)["senders"]["mysql"]["rows"] == 0
        assert status(url)["senders"]["mysql"]["process"]["pid"] is None  # started paused: no process, no target
        assert any(ln.split()[:2] == ["mysql", "paused"] for ln in cli("status").stdout.splitlines())
        assert cli("resume", "mysql").returncode == 0
        assert not paused_file.exists()
        wait_for(lambda: status(url)["senders"]["mysql"]["rows"] >= 1, 60, "mysql sending once resumed")
        assert status(url)["senders"]["mysql"]["process"]["pid"]

        # the Grafana dashboard asks only for metrics the capturer serves
        metrics = requests.get(url + "/metrics", timeout=10).text
        types = dict(re.findall(r"^# TYPE (\S+) (\S+)$", metrics, re.M))
        served = {ln.split("{")[0].split(" ")[0] for ln in metrics.splitlines() if ln and not ln.startswith("#")}
        served |= {n + "_total" if k == "counter" else n for n, k in types.items()}  # families with no sample now
        dash = json.loads((ROOT / "conf" / "grafana" / "capturer-dashboard.json").read_text())
        exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
        assert len(exprs) >= 8
        asked = {n for e in exprs for n in re.findall(r"\b((?:capturer|process)_[a-z_]+)\b", e)}
        assert asked and not asked - served, f"the dashboard asks for metrics nobody serves: {asked - served}"
        # Prometheus naming: counters end in _total, and a name is one family
        for name, kind in types.items():
            if kind == "counter":
                assert f"{name}_total" in served, name
            assert not name.endswith("_total") or kind == "counter", name
    finally:
        assert cap.stop() == 0
    from senders.local.replay import read_changes

    got = [(d["table"], d["after"] or d["before"]) for d in read_changes(tmp / "out" / "changes.jsonl")
           if d["op"] != "ddl"]
    msgs = [r.get("msg") for t, r in got if t == "log"]
    assert msgs == ["before", "still captured"], got  # 'filtered out' was not delivered
    assert [r["val"] for t, r in got if t == "pairs"] == ["after", "while stopped"]


def test_filter_reload_resubscribes_worker_regions(tmp_path: Path, two_servers: list[MariaDBInstance]) -> None:
    """A region decoded in a worker process (the agent code) got the rules with its
    subscription: a reload subscribes it again, and nothing is lost or repeated."""
    for m in two_servers:
        m.execute(*SCHEMA)
    cfg = write_config(tmp_path, two_servers, filter_text="", region_extra="process=true\n",
                       extra_global=f"controlToken={TOKEN}\n")
    port = re.search(r"httpPort=(\d+)", cfg.read_text()).group(1)  # type: ignore[union-attr]
    url = f"http://127.0.0.1:{port}"
    with capturer_under_load(cfg, tmp_path, two_servers):
        wait_for(lambda: all(r["state"] == "streaming" for r in status(url)["regions"].values()), 120, "streaming")
        (tmp_path / "filter_rule.txt").write_text("exclude other.*\n")
        r = post(url, "/filter/reload")
        assert r.status_code == 200 and r.json()["table_rules"] == 1, r.text
        wait_for(lambda: all("reloaded filter rules" in x["last_error"] and x["reconnects"] >= 1
                             for x in status(url)["regions"].values()), 60, "both regions subscribing again")
        wait_for(lambda: all(x["state"] == "streaming" for x in status(url)["regions"].values()), 60, "streaming again")
        rows = status(url)["senders"]["local"]["rows"]
        wait_for(lambda: status(url)["senders"]["local"]["rows"] > rows + 50, 60, "rows after the resubscription")
    file_state_equals(tmp_path, two_servers)
