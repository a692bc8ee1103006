"""Operator commands that talk to a running capturer over its status port:

    python -m capturer status [--url URL | --config CFG] [--watch [SECONDS]] [--json]
    python -m capturer pause SENDER | resume SENDER | reload-filter | stop   [--url] [--token]

``status`` prints the picture of the status page as tables (rows/s from two
samples). Exit codes: 0 healthy, 3 reachable but unhealthy, 1 not reachable,
2 bad usage, bad config, or a control call refused (no or wrong token).
The control commands send the config's ``controlToken`` (or ``--token``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from capturer.config import load_config
from capturer.errors import ConfigError
from capturer.model import ts_physical_ms


class CliError(Exception):
    def __init__(self, msg: str, code: int):
        super().__init__(msg)
        self.code = code


def resolve(config: str, url: str | None, token: str | None, need_token: bool) -> tuple[str, str]:
    """The status URL and control token: given, or from the config file."""
    if token is None:
        token = os.environ.get("CAPTURER_CONTROL_TOKEN") or None  # not on the command line, where ps shows it
    if url is None or (need_token and token is None):

        try:
            cfg = load_config(Path(config))
        except ConfigError as exc:
            raise CliError(f"config error: {exc} (or give --url{' and --token' if need_token else ''})", 2) from None
        if url is None:
            if not cfg.http_port:
                raise CliError("the config has httpPort=0 (a free port chosen at start): give --url", 2)
            host = {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "::1"}.get(cfg.http_host, cfg.http_host)
            if ":" in host and not host.startswith("["):
                host = f"[{host}]"  # an IPv6 address in a URL
            url = f"http://{host}:{cfg.http_port}"
        if token is None:
            token = cfg.control_token
    if need_token and not token:
        raise CliError("no control token: set controlToken in [global] of the config (and restart the "
                       "capturer), or give --token", 2)
    return url.rstrip("/"), token or ""


def request(url: str, path: str, token: str = "", body: dict[str, Any] | None = None,
            timeout: float = 60) -> tuple[int, dict[str, Any]]:
    """(HTTP status, JSON body). CliError(1) when the capturer cannot be reached."""
    data = None if body is None else json.dumps(body).encode()
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    req = urllib.request.Request(url + path, data=data, method="GET" if data is None else "POST", headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read() or b"{}")
    except urllib.error.HTTPError as exc:
        try:
            out = json.loads(exc.read() or b"{}")
        except ValueError:
            out = {}
        return exc.code, out if isinstance(out, dict) else {}
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise CliError(f"cannot reach the capturer at {url}: {getattr(exc, 'reason', exc)}", 1) from None


# --- status -------------------------------------------------------------------
def _when(ts: int) -> str:
    if not ts_physical_ms(ts):  # (none, or a commit_ts without a time: a first start's CREATE statements)
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(ts_physical_ms(ts) / 1000)) + \
        f".{ts_physical_ms(ts) % 1000:03d}"


def _secs(s: float | None) -> str:
    if s is None:
        return "-"
    if s < 1:
        return f"{s * 1000:.0f}ms"
    if s < 120:
        return f"{s:.1f}s"
    if s < 7200:
        return f"{s / 60:.1f}min"
    return f"{s / 3600:.1f}h"


def _n(v: Any) -> str:
    return "-" if v is None else f"{int(v):,}"


def _rate(cur: dict[str, Any], old: dict[str, Any] | None, dt: float) -> str:
    if old is None or dt <= 0 or cur["rows"] < old["rows"]:
        return "-"
    r = (cur["rows"] - old["rows"]) / dt
    return f"{r:,.0f}" if r >= 100 else f"{r:.1f}"


def _table(head: list[str], rows: list[list[str]], right: set[int]) -> list[str]:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(head)]

    def line(cells: list[str]) -> str:
        return "  ".join(c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths))).rstrip()

    return [line(head)] + [line(r) for r in rows]


def _bytes(n: int | None) -> str:
    if not n:
        return "0"
    for unit, size in (("GB", 1 << 30), ("MB", 1 << 20), ("KB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def render(url: str, d: dict[str, Any], health: dict[str, Any], old: dict[str, Any] | None) -> str:
    """The status as text: header, checkpoint and merger lines, a region table, a sender table."""
    dt = d["now"] - old["now"] if old and old.get("started_at") == d.get("started_at") else 0.0
    if dt <= 0:
        old = None
    ok = health.get("ok")
    out = [f"capturer at {url}   up {_secs(d.get('uptime_seconds'))}   "
           f"{'healthy' if ok else 'UNHEALTHY'}: {health.get('reason', '')}" + ("   (stopping)" if d.get("stopping") else "")]
    ha = d.get("ha") or {}
    if ha.get("role") in ("active", "standby"):
        h = ha.get("holder") or {}
        last = ha.get("last_takeover") or {}
        out.append(f"ha          {ha['role']} ({ha.get('id')}) of group {ha.get('name')!r}   epoch {ha.get('epoch')}   "
                   f"active: {h.get('id', 'none')}   last takeover: "
                   + (f"{time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(last['at']))} UTC ({last.get('from')} -> "
                      f"{last.get('to')})" if last.get("at") else "none")
                   + (f"   step-downs: {ha['step_downs']} (last: {(ha.get('last_step_down') or {}).get('why')})"
                      if ha.get("step_downs") else "")
                   + (f"   etcd: {ha['etcd']['error']}" if (ha.get("etcd") or {}).get("error") else ""))
    if ha.get("role") == "standby":
        return "\n".join(out)
    cp = d["checkpoint"]
    lag = d.get("lag_ms_behind_sources")
    out.append(f"checkpoint  {_when(cp['commit_ts'])} UTC, written {_secs(cp.get('age_seconds'))} ago   "
               f"behind the sources: {_secs(None if lag is None else lag / 1000)}")
    m = d.get("merger") or {}
    held = [f"region {r}" for r in m.get("waiting_for") or []] + \
        [f"sender {s} (backlog full)" for s in m.get("full_senders") or []]
    out.append(f"merger      watermark {_when(m.get('watermark') or 0)} UTC   held back by: "
               f"{', '.join(held) or 'nothing'}   {_n(m.get('dispatched_rows'))} rows handed out")
    out.append("")
    rows = []
    for name in sorted(d["regions"]):
        r = d["regions"][name]
        rows.append([name, str(r.get("kind", "")), r["state"], r.get("position_text") or "-", _secs(r["lag_seconds"]),
                     _rate(r, (old or {}).get("regions", {}).get(name), dt), _n(r["rows"]), _n(r["reconnects"]),
                     _n(r["queue_rows"]), (r.get("last_error") or "")[:80]])
    out += _table(["REGION", "KIND", "STATE", "POSITION", "LAG", "ROWS/S", "ROWS", "RECONNECTS", "QUEUED",
                   "LAST ERROR"], rows, {4, 5, 6, 7, 8})
    out.append("")
    rows = []
    for name, s in d["senders"].items():
        state = s.get("stream_state") or s["state"]
        if s.get("paused") and s["state"] != "paused":
            state = "pausing"
        rows.append([name, state, _rate(s, (old or {}).get("senders", {}).get(name), dt), _n(s["rows"]),
                     _when(s["acked_ts"]), _secs(s.get("lag_seconds")), _n(s.get("lag_rows", s["queue_rows"])),
                     _bytes(s.get("backlog_bytes", 0)), _n(s["retries"]), (s.get("last_error") or "")[:80]])
    out += _table(["SENDER", "STATE", "ROWS/S", "ROWS", "ACKED UP TO (UTC)", "LAG", "LAG ROWS", "BACKLOG",
                   "RETRIES", "LAST ERROR"], rows, {2, 3, 5, 6, 7, 8})
    st = d.get("stream")
    if st and st.get("backlog_max_bytes"):
        out.append(f"backlog     {_bytes(st['backlog_bytes'])} of {_bytes(st['backlog_max_bytes'])} in "
                   f"{st['backlog_dir']} ({st['backlog_segments']} segment(s), when full: {st['policy']})")
    snaps = [[rn, tn, t["state"], _n(t["rows"]), _n(t["estimated_rows"])]
             for rn, r in sorted(d["regions"].items())
             for tn, t in sorted(((r.get("snapshot") or {}).get("tables") or {}).items())]
    if snaps:
        out.append("")
        out += _table(["SNAPSHOT REGION", "TABLE", "STATE", "ROWS", "OF ABOUT"], snaps, {3, 4})
    return "\n".join(out)


def status_cli(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="capturer status", description="The running capturer's status as tables.")
    ap.add_argument("--config", default="conf/config.cfg", help="the running capturer's config (for its port)")
    ap.add_argument("--url", help="the status URL, e.g. http://127.0.0.1:8080 (default: from the config)")
    ap.add_argument("--watch", nargs="?", type=float, const=2.0, metavar="SECONDS",
                    help="refresh every SECONDS (default 2) until Ctrl-C")
    ap.add_argument("--count", type=int, default=0, help="with --watch: stop after this many refreshes")
    ap.add_argument("--json", action="store_true", help="print /status as JSON once")
    args = ap.parse_args(argv)
    if args.watch is not None and args.watch <= 0:
        ap.error("--watch: SECONDS must be > 0")
    try:
        url, _ = resolve(args.config, args.url, None, need_token=False)
    except CliError as exc:
        print(str(exc), file=sys.stderr)
        return exc.code
    if args.json:
        try:
            d = _get_status(url)
        except CliError as exc:
            print(str(exc), file=sys.stderr)
            return exc.code
        print(json.dumps(d, indent=2))
        return 0
    old: dict[str, Any] | None = None
    n = 0
    try:
        while True:
            try:
                d = _get_status(url)
                if old is None and args.watch is None:
                    old = d
                    time.sleep(1.0)  # a second sample, for rows/s
                    d = _get_status(url)
                _, health = request(url, "/health", timeout=10)
            except CliError as exc:
                if args.watch is None:
                    print(str(exc), file=sys.stderr)
                    return exc.code
                print(f"{time.strftime('%H:%M:%S')} {exc}; retrying", flush=True)
                health = None
            if health is not None:
                text = render(url, d, health, old)
                if args.watch is not None and sys.stdout.isatty():
                    sys.stdout.write("\033[H\033[2J")
                print(text + ("\n" if args.watch is not None else ""), flush=True)
                old = d
            n += 1
            if args.watch is None:
                return 0 if health and health.get("ok") else 3
            if args.count and n >= args.count:
                return 0 if health is not None else 1
            time.sleep(args.watch)
    except KeyboardInterrupt:
        return 0


def _get_status(url: str) -> dict[str, Any]:
    code, d = request(url, "/status", timeout=10)
    if code != 200 or ("checkpoint" not in d and (d.get("ha") or {}).get("role") != "standby"):
        raise CliError(f"{url}/status answered HTTP {code}: {d.get('error', '')}", 1)
    return d


# --- control --------------------------------------------------------------------
CONTROL = {
    "pause": "stop sending to SENDER after the batch in hand (the others go on; the backlog keeps its share)",
    "resume": "go on sending to SENDER",
    "reload-filter": "read filterRuleDict again (a file with an error changes nothing)",
    "stop": "stop the capturer gracefully (senders drain, a final checkpoint)",
    "attach": "attach a detached sender again (it goes on from the stream's head)",
    "handover": "with [ha]: the active capturer drains, writes a final checkpoint, gives its lease up to a standby "
                "and stays as a standby",
}


def control_cli(verb: str, argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog=f"capturer {verb}", description=CONTROL[verb])
    if verb in ("pause", "resume", "attach"):
        ap.add_argument("sender", help="the sender's name (a type= of senderConfig: mysql, kafka, local, spark)")
    ap.add_argument("--config", default="conf/config.cfg", help="the running capturer's config (port, token)")
    ap.add_argument("--url", help="the status URL (default: from the config)")
    ap.add_argument("--token", help="the control token (default: $CAPTURER_CONTROL_TOKEN, else controlToken of "
                                    "the config)")
    args = ap.parse_args(argv)
    path = {"reload-filter": "/filter/reload", "stop": "/stop", "handover": "/handover"}.get(verb) or \
        f"/senders/{urllib.parse.quote(args.sender, safe='')}/{verb}"
    code, out = control_call(args.config, args.url, args.token, path, {})
    if code == 0:
        print(json.dumps(out))
    return code


def control_call(config: str, url: str | None, token: str | None, path: str,
                 body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """POST a control endpoint: (exit code, answer). Errors are printed: 2 for a
    refusal (bad request, no or wrong token: the caller's to fix, as a bad config),
    1 when the capturer cannot be reached or fails."""
    try:
        url, token = resolve(config, url, token, need_token=True)
        code, out = request(url, path, token, body)
    except CliError as exc:
        print(str(exc), file=sys.stderr)
        return exc.code, {}
    if code >= 300:
        print(f"refused: HTTP {code}: {out.get('error', '')}", file=sys.stderr)
        return (2 if 400 <= code < 500 else 1), out
    return 0, out
