"""``verify``: does every sink hold what its sources hold? Checked while capture goes on.

``python -m capturer verify --config conf/config.cfg [--sender NAME] [--table db.table] [--json]``
and ``POST /verify`` (the running capturer, behind ``controlToken``, runs that command in
a child process) compare, table by
table, each sender's destination with the sources (docs/verify.md):

* **Sources**: the MySQL/MariaDB and PostgreSQL regions (read over SQL); a table that
  several regions deliver to one destination table is compared as their union. Only
  tables the filter selects, only rows its row rules keep. BaikalDB regions and
  regions served by agents have no SQL front end here: their tables are "cannot check".
* **Sinks** (readers in ``senders/<kind>/verify.py``, handed in by the composition
  root): the MySQL target (chunk checksums computed in both databases, then only the
  chunks that differ row by row), the file (replayed), Kafka (the newest value per
  key), the lake (its merged views).
* **Values, not text**: every value is brought to one form by the *source* column's
  type (``canon``): DECIMAL ``"19.990"`` equals ``19.99``, a base64 string equals its
  bytes, a TIMESTAMP is compared in UTC.
* **While the stream moves**: a first pass finds the keys that differ; each is then
  re-checked: read from the sources, the sources' positions taken, the sender given
  time to acknowledge past those positions (its position in the checkpoint), the sink
  read, the sources read again. A key whose sink value is neither source reading and
  whose source did not change in between is *different*; one whose source changed is
  read again next round (*unsettled* after the last); a sender that does not
  acknowledge past the positions in ``wait`` seconds is *not caught up*: paused, failing
  or lagging, and not a difference. Exit codes: 0 equal, 1 different, 2 bad config or
  an unreachable source or destination, 3 could not settle (not caught up, unsettled,
  cannot check).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from capturer.errors import ConfigError
from capturer.model import AnyPosition, rowsum
from capturer.model.compare import (
    ReaderFactory,
    SinkReader,
    SourceUnreachable,
    TableMeta,
    digest,
)
from capturer.pipeline.checkpoint import load_checkpoint
from capturer.pipeline.filter import load_filter, split_table_name
from capturer.regions import kind as region_kind
from capturer.util.dotted import load

log = logging.getLogger(__name__)

# --- results --------------------------------------------------------------------------

EQUAL, DIFFERENT, NOT_CAUGHT_UP, UNSETTLED, MISSING_TABLE, CANNOT = (
    "equal", "different", "not caught up", "unsettled", "missing table", "cannot check")


@dataclass
class TableResult:
    sender: str
    table: str  # the source table(s): db.table (several names joined by +)
    destination: str  # where in the sink
    status: str = EQUAL
    rows: int = 0  # source rows compared
    sink_rows: int = 0
    missing: int = 0
    extra: int = 0
    different: int = 0
    unsettled: int = 0
    examples: list[str] = field(default_factory=list)
    note: str = ""
    method: str = ""
    checked_at: float = 0.0
    seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {k: (round(v, 3) if isinstance(v, float) else v) for k, v in self.__dict__.items()}

    def line(self) -> str:
        head = f"{self.sender:8s} {self.table} -> {self.destination}: {self.status}"
        counts = (f" ({self.rows} source rows, {self.sink_rows} in the sink: {self.missing} missing, "
                  f"{self.extra} extra, {self.different} different"
                  + (f", {self.unsettled} unsettled" if self.unsettled else "") + ")")
        return head + (counts if self.status != CANNOT else "") + (f"; {self.note}" if self.note else "")


@dataclass
class Report:
    started: float
    finished: float = 0.0
    results: list[TableResult] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # a source or destination that could not be read

    @property
    def exit_code(self) -> int:
        if self.errors:
            return 2
        if any(r.status in (DIFFERENT, MISSING_TABLE) for r in self.results):
            return 1
        if any(r.status != EQUAL for r in self.results):
            return 3
        return 0

    def summary(self) -> dict[str, int]:
        return dict(Counter(r.status for r in self.results))

    def to_json(self) -> dict[str, Any]:
        return {"started": round(self.started, 3), "finished": round(self.finished, 3),
                "seconds": round(self.finished - self.started, 3), "exit_code": self.exit_code,
                "summary": self.summary(), "errors": self.errors,
                "tables": [r.to_json() for r in self.results]}


# --- the comparison -------------------------------------------------------------------

@dataclass
class _Group:
    """The source tables (region, db, table) one destination table is compared with."""

    dest: tuple[str, str]
    sources: list[tuple[str, str, str]]
    meta: TableMeta | None = None

    @property
    def label(self) -> str:
        names = sorted({f"{d}.{t}" for _, d, t in self.sources})
        return "+".join(names)


Acked = Callable[[], dict[str, dict[str, AnyPosition]]]


@dataclass
class Options:
    senders: list[str] | None = None  # None: every sender
    tables: list[tuple[str, str]] | None = None  # None: every captured table
    wait: float = 60.0  # seconds a sender is given to acknowledge past the sources' positions
    rounds: int = 3
    chunk_rows: int = 10_000
    recheck_cap: int = 100_000  # keys re-checked one by one; beyond, the table is compared again whole
    examples: int = 5


class Verifier:
    """Runs one comparison of every selected sender with the sources (``run``)."""

    def __init__(self, sources: dict[str, Any], readers: dict[str, SinkReader], table_selected: Callable[..., bool],
                 row_keep: Callable[[str, str, dict[str, Any]], bool], row_rules: Callable[[str, str], bool],
                 acked: Acked, options: Options, unreadable_regions: dict[str, str] | None = None,
                 progress: Callable[[dict[str, Any]], None] | None = None, stop: threading.Event | None = None):
        self.sources = sources  # region -> MySQLSource | PostgresSource
        self.readers = readers
        self.table_selected = table_selected
        self.row_keep = row_keep
        self.has_row_rules = row_rules
        self.acked = acked
        self.o = options
        self.unreadable_regions = unreadable_regions or {}
        self.progress = progress or (lambda d: None)
        self.stop = stop or threading.Event()
        self._executor: Any = None
        self._stalled: set[str] = set()  # senders found behind their sources in this run

    def _pool(self) -> Any:
        """Threads for the chunk checksums (one query per server at once), kept for the run."""
        if self._executor is None:
            from concurrent.futures import ThreadPoolExecutor

            self._executor = ThreadPoolExecutor(max_workers=len(self.sources) + 1, thread_name_prefix="verify")
        return self._executor

    # -- discovery --
    def _source_tables(self) -> dict[tuple[str, str], list[str]]:
        found: dict[tuple[str, str], list[str]] = {}
        for region, src in self.sources.items():
            for db, table in src.tables():
                if self.o.tables is not None and (db, table) not in self.o.tables:
                    continue
                if self.table_selected(db, table):
                    found.setdefault((db, table), []).append(region)
        return found

    def _groups(self, reader: SinkReader, found: dict[tuple[str, str], list[str]]) -> list[_Group]:
        groups: dict[tuple[str, str], _Group] = {}
        for (db, table), regions in sorted(found.items()):
            dest = reader.destination(db, table)
            g = groups.setdefault(dest, _Group(dest, []))
            g.sources += [(r, db, table) for r in regions]
        return list(groups.values())

    # -- run --
    def run(self) -> Report:
        report = Report(time.time())
        try:
            found = self._source_tables()
        except SourceUnreachable as exc:
            report.errors.append(str(exc))
            report.finished = time.time()
            return report
        for db, table in self.o.tables or []:
            if (db, table) not in found:
                report.errors.append(f"table {db}.{table}: in no region read here, or not selected by the filter")
        names = [n for n in self.readers if self.o.senders is None or n in self.o.senders]
        plan = [(n, g) for n in names for g in self._groups(self.readers[n], found)]
        for i, (name, g) in enumerate(plan):
            if self.stop.is_set():
                report.errors.append("stopped before the end")
                break
            self.progress({"tables_done": i, "tables_total": len(plan), "current": f"{name}: {g.label}"})
            t0 = time.time()
            try:
                res = self._check(self.readers[name], g)
            except SourceUnreachable as exc:
                report.errors.append(str(exc))
                continue
            except Exception as exc:  # a destination that cannot be read: named, the rest goes on
                log.warning("verify %s %s: %s", name, g.label, exc, exc_info=True)
                report.errors.append(f"sender {name}, {g.label} ({self.readers[name].where(g.dest)}): "
                                     f"{type(exc).__name__}: {exc}")
                continue
            res.checked_at, res.seconds = time.time(), time.time() - t0
            report.results.append(res)
            log.info("verify: %s", res.line())
        for name in names:
            for region, why in sorted(self.unreadable_regions.items()):
                report.results.append(TableResult(
                    name, f"tables of region {region}", self.readers[name].where(("", "")), CANNOT,
                    note=f"{why}: its tables are not compared (a table it shares with a region read here "
                         "shows its rows as extra)", checked_at=time.time()))
        for name in self.o.senders or []:
            if name not in self.readers:
                report.errors.append(f"no sender {name!r} (configured: {', '.join(self.readers) or 'none'})")
        self.progress({"tables_done": len(plan), "tables_total": len(plan), "current": ""})
        report.finished = time.time()
        return report

    def _meta(self, g: _Group) -> TableMeta:
        metas = []
        for region, db, table in g.sources:
            m = self.sources[region].meta(db, table)
            if m is not None:
                metas.append(m)
        if not metas:
            raise SourceUnreachable(f"{g.label}: no longer in the sources")
        return metas[0]

    def _check(self, reader: SinkReader, g: _Group) -> TableResult:
        res = TableResult(reader.name, g.label, reader.where(g.dest))
        if getattr(reader, "cannot", ""):
            res.status, res.note = CANNOT, reader.cannot  # type: ignore[attr-defined]
            return res
        meta = self._meta(g)
        g.meta = meta
        reader.refresh()
        use_sums = bool(hasattr(reader, "checksum") and meta.pk
                        and all(self.sources[r].kind == "mysql" for r, _, _ in g.sources)
                        and not any(self.has_row_rules(d, t) for _, d, t in g.sources))
        res.method = "chunk checksums" if use_sums else "rows"
        diff = self._first_pass(reader, g, res)
        self._settle(reader, g, res, diff)
        if res.status == DIFFERENT and not _exists(reader, g.dest):
            res.status = MISSING_TABLE
        if res.status == EQUAL and res.rows == 0 and not _exists(reader, g.dest):
            res.note = _join(res.note, "the destination has no such table; the source table is empty")
        return res

    def _first_pass(self, reader: SinkReader, g: _Group, res: TableResult) -> _Diff:
        if res.method == "chunk checksums" and _exists(reader, g.dest):
            return self._sums_pass(reader, g, res)
        return self._rows_pass(reader, g, res)

    # -- positions --
    def _positions(self, g: _Group) -> dict[str, AnyPosition]:
        return {r: self.sources[r].position() for r in sorted({r for r, _, _ in g.sources})}

    def _behind(self, sender: str, want: dict[str, AnyPosition]) -> str:
        """'' when the sender has acknowledged past ``want`` in every region, else where it is."""
        have = self.acked().get(sender, {})
        lag = []
        for region, pos in want.items():
            got = have.get(region)
            if got is None or type(got) is not type(pos) or got < pos:  # type: ignore[operator]
                lag.append(f"{region} at {got if got is not None else 'nothing acknowledged'}, source at {pos}")
        return "; ".join(lag)

    def _wait(self, sender: str, want: dict[str, AnyPosition]) -> str:
        """Until the sender is past ``want`` ('') or ``wait`` seconds passed (where it is).
        A sender found behind once is not waited for again in this run (a paused one
        would cost ``wait`` per table): later tables only look whether it caught up."""
        deadline = time.monotonic() + (0 if sender in self._stalled else self.o.wait)
        while True:
            lag = self._behind(sender, want)
            if not lag or time.monotonic() >= deadline or self.stop.is_set():
                if lag:
                    self._stalled.add(sender)
                else:
                    self._stalled.discard(sender)
                return lag
            time.sleep(0.25)

    # -- the first pass --
    def _source_chunks(self, g: _Group) -> Iterator[list[dict[str, Any]]]:
        assert g.meta is not None
        for region, db, table in g.sources:
            m = TableMeta(db, table, g.meta.columns, g.meta.kinds, g.meta.pk, g.meta.pg_types)
            src = self.sources[region]
            if src.kind == "postgresql":
                src.meta(db, table)  # its parsers
            for chunk in src.chunks(m, self.o.chunk_rows):
                yield [r for r in chunk if self.row_keep(db, table, r)]

    def _rows_pass(self, reader: SinkReader, g: _Group, res: TableResult) -> _Diff:
        meta = g.meta
        assert meta is not None
        got = reader.rows(g.dest, meta.columns) or []
        if not meta.pk:
            return self._multiset_pass(got, g, res)
        sink: dict[tuple[Any, ...], bytes] = {}
        dup = 0
        for row in got:
            k = meta.canon_key(row)
            if k in sink:
                dup += 1
            sink[k] = digest(meta.canon_row(row))
        res.sink_rows = len(sink) + dup
        diff = _Diff()
        for chunk in self._source_chunks(g):
            for row in chunk:
                res.rows += 1
                k = meta.canon_key(row)
                d = sink.pop(k, None)
                if d is None:
                    diff.keys.add(k)
                    res.missing += 1
                elif d != digest(meta.canon_row(row)):
                    diff.keys.add(k)
                    res.different += 1
        res.extra = len(sink)
        diff.keys.update(sink)
        if dup:
            res.note = _join(res.note, f"{dup} keys appear more than once in the sink")
            res.extra += dup
            diff.whole = True
        return diff

    def _multiset_pass(self, got: Iterable[dict[str, Any]], g: _Group, res: TableResult) -> _Diff:
        meta = g.meta
        assert meta is not None
        sink = Counter(meta.canon_row(r) for r in got)
        res.sink_rows = sum(sink.values())
        src: Counter[tuple[Any, ...]] = Counter()
        for chunk in self._source_chunks(g):
            res.rows += len(chunk)
            src.update(meta.canon_row(r) for r in chunk)
        lost, more = src - sink, sink - src
        res.missing, res.extra, res.different = sum(lost.values()), sum(more.values()), 0
        diff = _Diff(whole=bool(lost or more))
        for row in list(lost)[:self.o.examples]:
            diff.examples.append(f"missing {meta.show(row)}")
        for row in list(more)[:self.o.examples]:
            diff.examples.append(f"extra {meta.show(row)}")
        return diff

    def _sums_pass(self, reader: Any, g: _Group, res: TableResult) -> _Diff:
        """Chunk by chunk over key ranges: the sources' COUNT/SUM(CRC32) against the
        target's, both computed in the servers; a chunk that differs row by row."""
        meta = g.meta
        assert meta is not None
        # the chunk boundaries: from the region with the most rows (any boundaries cover every row)
        regions = [(r, TableMeta(d, t, meta.columns, meta.kinds, meta.pk)) for r, d, t in g.sources]
        lead = max(regions, key=lambda x: self.sources[x[0]].query(
            "SELECT COALESCE(MAX(TABLE_ROWS), 0) FROM information_schema.TABLES WHERE TABLE_SCHEMA=%s AND "
            "TABLE_NAME=%s", (x[1].db, x[1].table))[0][0])
        diff = _Diff()
        lo: list[Any] | None = None
        pool = self._pool()
        while True:
            hi = self.sources[lead[0]].boundary(lead[1], lo, self.o.chunk_rows)
            where, args = rowsum.range_sql(meta.pk, lo, hi)
            futs = [pool.submit(self.sources[r].checksum, m, where, args) for r, m in regions]
            tfut = pool.submit(reader.checksum, g.dest, meta.columns, where, args)
            sums = [f.result() for f in futs]
            want = (sum(s[0] for s in sums), sum(s[1] for s in sums))
            have = tfut.result()
            res.rows += want[0]
            res.sink_rows += have[0]
            if want != have:
                self._chunk_rows(reader, g, regions, where, args, res, diff)
            if hi is None or self.stop.is_set():
                break
            lo = hi
        return diff

    def _chunk_rows(self, reader: Any, g: _Group, regions: list[tuple[str, TableMeta]], where: str,
                    args: Sequence[Any], res: TableResult, diff: _Diff) -> None:
        meta = g.meta
        assert meta is not None
        src: dict[tuple[Any, ...], tuple[Any, ...]] = {}
        for r, m in regions:
            for row in self.sources[r].select(m, where, args):
                src[meta.canon_key(row)] = meta.canon_row(row)
        sink = {}
        for row in reader.select(g.dest, meta.columns, where, args):
            sink[meta.canon_key(row)] = meta.canon_row(row)
        for k, row in src.items():
            s = sink.pop(k, None)
            if s is None:
                res.missing += 1
                diff.keys.add(k)
            elif s != row:
                res.different += 1
                diff.keys.add(k)
        res.extra += len(sink)
        diff.keys.update(sink)

    # -- re-checks --
    def _read_keys(self, reader: SinkReader, g: _Group, keys: list[tuple[Any, ...]],
                   source: bool) -> dict[tuple[Any, ...], list[tuple[Any, ...]]]:
        meta = g.meta
        assert meta is not None
        out: dict[tuple[Any, ...], list[tuple[Any, ...]]] = {}
        if source:
            for region, db, table in g.sources:
                m = TableMeta(db, table, meta.columns, meta.kinds, meta.pk, meta.pg_types)
                src = self.sources[region]
                if src.kind == "postgresql":
                    src.meta(db, table)
                for row in src.rows_for_keys(m, keys):
                    if self.row_keep(db, table, row):
                        out.setdefault(meta.canon_key(row), []).append(meta.canon_row(row))
            return out
        want = set(keys)
        if hasattr(reader, "keys_rows"):
            rows: Iterable[dict[str, Any]] = reader.keys_rows(g.dest, meta.columns, meta.pk, keys)
        else:
            reader.refresh()
            rows = reader.rows(g.dest, meta.columns) or []
        for row in rows:
            k = meta.canon_key(row)
            if k in want:
                out.setdefault(k, []).append(meta.canon_row(row))
        return out

    def _settle(self, reader: SinkReader, g: _Group, res: TableResult, diff: _Diff) -> None:
        """Re-check what the first pass found (see the module docstring); sets ``res.status``."""
        meta = g.meta
        assert meta is not None
        examples: list[str] = list(diff.examples)
        for rnd in range(self.o.rounds):
            if diff.empty():
                break
            if diff.whole or len(diff.keys) > self.o.recheck_cap:
                # no key (or too many keys): once the sender is past where the sources are, all again
                lag = self._wait(reader.name, self._positions(g))
                if lag:
                    res.status, res.note = NOT_CAUGHT_UP, _join(res.note, f"sender {reader.name} behind: {lag}")
                    res.examples = examples[:self.o.examples]
                    return
                reader.refresh()
                fresh = TableResult(res.sender, res.table, res.destination, method=res.method)
                diff = self._first_pass(reader, g, fresh)
                for k in ("rows", "sink_rows", "missing", "extra", "different"):
                    setattr(res, k, getattr(fresh, k))
                res.note = _join(res.note, fresh.note)
                examples = list(diff.examples)
                continue
            keys = sorted(diff.keys, key=repr)
            first = self._read_keys(reader, g, keys, True)
            lag = self._wait(reader.name, self._positions(g))
            if lag:
                res.status, res.note = NOT_CAUGHT_UP, _join(res.note, f"sender {reader.name} behind: {lag}")
                res.examples = examples[:self.o.examples]
                return
            sink = self._read_keys(reader, g, keys, False)
            second = self._read_keys(reader, g, keys, True)
            missing = extra = different = unsettled = 0
            left: set[tuple[Any, ...]] = set()
            examples = []
            for key in keys:
                s = sorted(sink.get(key, []), key=repr)
                a, b = sorted(first.get(key, []), key=repr), sorted(second.get(key, []), key=repr)
                if s in (a, b):
                    continue
                left.add(key)
                if a != b:
                    unsettled += 1
                    continue
                if not s:
                    missing += 1
                    what = f"missing {meta.show(a[0])}"
                elif not a:
                    extra += 1
                    what = f"extra {meta.show(s[0])}" + (f" ({len(s)} rows with this key)" if len(s) > 1 else "")
                else:
                    different += 1
                    what = (f"key {meta.show_key(key)}: {meta.show_diff(a[0], s[0])}"
                            + (f" ({len(s)} rows with this key in the sink)" if len(s) > 1 else ""))
                if len(examples) < self.o.examples:
                    examples.append(what)
            res.missing, res.extra, res.different, res.unsettled = missing, extra, different, unsettled
            diff = _Diff(keys=left)
            if not unsettled and (rnd >= 1 or self.o.rounds == 1):
                break  # every key left is stable in the sources and differs in the sink
        res.examples = examples[:self.o.examples]
        if diff.empty():
            res.status = EQUAL
            res.missing = res.extra = res.different = res.unsettled = 0
        elif res.missing or res.extra or res.different:
            res.status = DIFFERENT
        else:
            res.status = UNSETTLED
            res.note = _join(res.note, "rows kept changing in the sources while they were compared")


@dataclass
class _Diff:
    keys: set[tuple[Any, ...]] = field(default_factory=set)
    whole: bool = False  # compare the whole table again (no key, or keys repeated in the sink)
    examples: list[str] = field(default_factory=list)

    def empty(self) -> bool:
        return not self.keys and not self.whole


def _exists(reader: Any, dest: tuple[str, str]) -> bool:
    """Whether the destination table exists (sinks without tables of their own: always)."""
    return bool(reader.exists(dest)) if hasattr(reader, "exists") else True


def _join(a: str, b: str) -> str:
    return f"{a}; {b}" if a and b else (a or b)


# --- building a Verifier from the config ------------------------------------------------

def build(cfg: Any, factories: dict[str, ReaderFactory], acked: Acked, options: Options,
          filt: Any = None, progress: Callable[[dict[str, Any]], None] | None = None,
          stop: threading.Event | None = None) -> tuple[Verifier, list[SinkReader]]:
    """A Verifier for ``cfg`` (an AppConfig): its regions as sources, its senders' readers."""

    filt = filt if filt is not None else load_filter(cfg.filter_path)
    sources: dict[str, Any] = {}
    unreadable: dict[str, str] = {}
    for r in cfg.regions:
        k = region_kind(r.type)
        if k.verify:
            sources[r.name] = load(k.verify)(r)
        else:
            unreadable[r.name] = f"a {r.type} region: {k.no_verify or 'verify cannot read its source'}"
    readers: dict[str, SinkReader] = {}
    for s in cfg.senders:
        if options.senders is not None and s.name not in options.senders:
            continue
        f = factories.get(s.name)
        if f is None:
            continue
        readers[s.name] = f(s.name, s.options, [(r.name, r.type, "") for r in cfg.regions])

    def keep(db: str, table: str, row: dict[str, Any]) -> bool:
        rules = filt._rules_for(db, table)
        return not rules or filt._row_ok(rules, row)

    v = Verifier(sources, readers, filt.table_selected, keep, lambda d, t: bool(filt._rules_for(d, t)), acked,
                 options, unreadable, progress, stop)
    return v, list(readers.values())


def close_all(v: Verifier, readers: Iterable[SinkReader]) -> None:
    """Close what ``build`` opened (never raises)."""
    if v._executor is not None:
        v._executor.shutdown(wait=True)
    for r in readers:
        try:
            r.close()
        except Exception:
            pass
    for src in v.sources.values():
        src.close()


def checkpoint_acked(path: Any, ha: Callable[[], Any] | None = None) -> Acked:
    """Each sender's acknowledged positions as the checkpoint file holds them (with
    ``[ha]``, ``ha()``: the checkpoint the active capturer last wrote to etcd)."""

    def acked() -> dict[str, dict[str, AnyPosition]]:
        try:
            cp = load_checkpoint(path) if ha is None else ha()
        except Exception:
            return {}
        if cp is None:
            return {}
        return {n: dict(sp.regions) for n, sp in cp.senders.items()}
    return acked


def parse_tables(items: Sequence[str]) -> list[tuple[str, str]]:

    return [split_table_name(t) for t in items]


def print_report(report: Report, out: Any = sys.stdout) -> None:
    for r in report.results:
        print(r.line(), file=out)
        for e in r.examples:
            print(f"    {e}", file=out)
    for e in report.errors:
        print(f"error: {e}", file=out)
    s = report.summary()
    verdict = {0: "all equal", 1: "DIFFERENT", 2: "could not read everything", 3: "not settled"}[report.exit_code]
    print(f"verify: {verdict}: " + (", ".join(f"{n} {k}" for k, n in sorted(s.items())) or "no table")
          + f" in {report.finished - report.started:.1f}s", file=out)


def verify_cli(argv: list[str], load_config: Callable[[Any], Any], factories: dict[str, ReaderFactory],
               ha_checkpoint: Callable[[Any], Any] | None = None) -> int:
    """``ha_checkpoint(cfg.ha)``: the checkpoint an [ha] group's active capturer last
    published (capturer/ha/check.py, handed in by the command line)."""
    ap = argparse.ArgumentParser(prog="capturer verify",
                                 description="Compare every sender's destination with the sources, while capture "
                                             "goes on. Exit: 0 equal, 1 different, 2 bad config or unreachable, "
                                             "3 not settled (a sender not caught up, rows that kept changing).")
    ap.add_argument("--config", default="conf/config.cfg")
    ap.add_argument("--sender", action="append", help="only this sender (repeat)")
    ap.add_argument("--table", action="append", help="only this db.table (repeat; backticks quote dots)")
    ap.add_argument("--json", action="store_true", help="the report as JSON on stdout")
    ap.add_argument("--wait", type=float, default=60.0,
                    help="seconds a sender is given to acknowledge past the sources' positions (default 60)")
    ap.add_argument("--rounds", type=int, default=3, help="re-checks of rows that differ (default 3)")
    ap.add_argument("--chunk-rows", type=int, default=10_000)
    ap.add_argument("--progress", action="store_true",
                    help='progress as {"progress": {...}} JSON lines on stderr (POST /verify reads them)')
    args = ap.parse_args(argv)
    from pathlib import Path


    try:
        cfg = load_config(Path(args.config))
        tables = parse_tables(args.table) if args.table else None
    except (ConfigError, ValueError) as exc:
        print(f"config error: {exc}", file=sys.stderr)
        return 2
    unknown = [s for s in args.sender or [] if s not in {c.name for c in cfg.senders}]
    if unknown:
        print(f"config error: {cfg.sender_config_path}: no sender {', '.join(unknown)} "
              f"(configured: {', '.join(c.name for c in cfg.senders)})", file=sys.stderr)
        return 2
    opts = Options(senders=args.sender, tables=tables, wait=args.wait, rounds=max(1, args.rounds),
                   chunk_rows=max(100, args.chunk_rows))
    for c in cfg.senders:
        if c.name not in factories and (args.sender is None or c.name in args.sender):
            print(f"verify: sender {c.name}: not compared: verify cannot read its destination back", file=sys.stderr)
    try:
        def progress(d: dict[str, Any]) -> None:
            print(json.dumps({"progress": d}), file=sys.stderr, flush=True)

        v, readers = build(cfg, factories, checkpoint_acked(cfg.checkpoint_path, None if cfg.ha is None or ha_checkpoint is None else (lambda: ha_checkpoint(cfg.ha))), opts,
                           progress=progress if args.progress else None)
    except (ConfigError, OSError, ImportError) as exc:
        print(f"verify: {exc}", file=sys.stderr)
        return 2
    try:
        report = v.run()
    finally:
        close_all(v, readers)
    if args.json:
        print(json.dumps(report.to_json(), indent=2, default=str))
    else:
        print_report(report)
    return report.exit_code
