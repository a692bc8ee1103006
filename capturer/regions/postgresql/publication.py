"""Tables added to a PostgreSQL region's publication while it streams: copied live (issue 49).

A table added to the publication (``ALTER PUBLICATION ... ADD TABLE``) brings rows the WAL never
carried: its changes from then on are decoded, its older rows are not. The watch keeps the tables the
publication names one by one (``pg_publication_rel``: ``FOR TABLE`` and ``ADD TABLE``) in a side file of the checkpoint (``<checkpoint>.pgpub.<region>``; high
availability ships it with the others). When the region streams, at once and then every
``publication_check_s`` (and at once when the stream describes a relation the targets were not given
yet), it lists the publication again: a table the file lacks that the filter selects is asked to be
copied (``RegionContext.copy_new``: its changes held back until its copy starts, then copied as a
filter reload's new table is, as ``snapshotNewTables`` says; status reason "added to the
publication"). The file takes the new list only once the copy is asked for (the copy's own record in
``<checkpoint>.copies`` carries it through a crash from then on): a copy refused, or a source that did
not answer, is asked for again at the next look.

The first look of a region without the file writes it and copies nothing: those tables were the
region's from its start (its ``snapshot`` setting says whether they are copied). A table that leaves
the publication is forgotten (added again later, it is copied again). Tables a ``FOR ALL TABLES`` or
``TABLES IN SCHEMA`` publication takes in are not named one by one and are never copied by the watch:
a table created under one has all its rows in the WAL from its creation (a copy would deliver them
twice); one brought in with rows of its own (``ADD TABLES IN SCHEMA``, ``ALTER TABLE ... SET
SCHEMA``) needs an on-demand snapshot."""

from __future__ import annotations

import json
import logging
import threading
import time
from pathlib import Path
from typing import Any

from capturer.errors import CheckpointError, SourceError
from capturer.util.durable import rewrite_lines

log = logging.getLogger(__name__)


class PublicationWatch:
    def __init__(self, region: Any):
        self.r = region
        self.path: Path | None = region.state_file("pgpub")
        self.wake = threading.Event()
        self.thread: threading.Thread | None = None
        self.looks = 0
        self.copies_asked = 0
        self.last_added: dict[str, Any] | None = None  # (status) the newest tables asked to be copied
        self.last_error = ""
        self._mem: set[tuple[str, str]] | None = None  # the list without a checkpoint path (in memory)

    # --- the side file ----------------------------------------------------------
    def load(self) -> set[tuple[str, str]] | None:
        """The tables the file holds; None when there is none yet."""
        if self.path is None:
            return self._mem
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return None
        try:
            return {(str(db), str(t)) for db, t in json.loads(text)["tables"]}
        except (ValueError, KeyError, TypeError) as exc:
            raise CheckpointError(f"{self.path}: not the publication's tables of region {self.r.name} ({exc}); "
                                  "delete the file to take the publication as it is now (tables added since "
                                  "the last look are then not copied)") from None

    def save(self, tables: set[tuple[str, str]]) -> None:
        if self.path is None:
            self._mem = set(tables)
            return
        rewrite_lines(self.path, [json.dumps({"publication": self.r.cfg.publication,
                                              "tables": sorted([db, t] for db, t in tables)})])

    # --- looking ------------------------------------------------------------------
    def start(self) -> None:
        if self.r.cfg.publication_check_s <= 0 or self.thread is not None or self.r.ctx.copy_new is None:
            return
        self.thread = threading.Thread(target=self._run, name=f"pgpub-{self.r.name}", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        stop = self.r.ctx.stop
        looked = False
        while not stop.is_set():
            if looked:
                self.wake.wait(self.r.cfg.publication_check_s)
                self.wake.clear()
            if stop.is_set():
                return
            if self.r.state != "streaming":
                stop.wait(0.5)
                continue
            looked = True
            try:
                self.look()
                self.last_error = ""
            except Exception as exc:  # a source that does not answer, a copy refused: next time
                self.last_error = str(exc)
                log.warning("%s: the publication's new tables: %s (looked at again in %.0f s)", self.r.where,
                            exc, self.r.cfg.publication_check_s)

    def look(self) -> list[tuple[str, str]]:
        """List the publication; ask for the copy of the tables new in it that the filter
        selects. Returns those."""
        now = self.named_tables()
        self.looks += 1
        saved = self.load()
        if saved is None:
            self.save(now)
            return []
        wanted = [t for t in sorted(now - saved) if self.r.ctx.table_selected(*t)]
        if wanted:
            log.info("%s: table(s) added to publication %s: %s: copied (snapshotNewTables)", self.r.where,
                     self.r.cfg.publication, ", ".join(f"{db}.{t}" for db, t in wanted))
            copy_new = self.r.ctx.copy_new
            assert copy_new is not None
            copy_new(self.r.name, wanted, "added to the publication")
            self.copies_asked += 1
            self.last_added = {"at": round(time.time(), 3), "tables": [f"{db}.{t}" for db, t in wanted]}
        if now != saved:
            self.save(now)
        return wanted

    def named_tables(self) -> set[tuple[str, str]]:
        """The tables the publication names one by one (not those of FOR ALL TABLES or
        TABLES IN SCHEMA), on a connection of the watch's own."""
        import psycopg

        try:
            with psycopg.connect(self.r._conninfo(False), autocommit=True) as c:
                rows = c.execute(
                    "SELECT n.nspname::text, c.relname::text FROM pg_publication p "
                    "JOIN pg_publication_rel r ON r.prpubid = p.oid JOIN pg_class c ON c.oid = r.prrelid "
                    "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE p.pubname = %s",
                    (self.r.cfg.publication,)).fetchall()
        except psycopg.Error as exc:
            raise SourceError(f"{self.r.where}: cannot list the publication's tables: {str(exc).strip()}") from None
        return {(str(db), str(t)) for db, t in rows}

    def status(self) -> dict[str, Any]:
        return {"looks": self.looks, "copies_asked": self.copies_asked, "last_added": self.last_added,
                "error": self.last_error}
