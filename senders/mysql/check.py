"""``--check --connect`` of the MySQL sender: the sender's own connection logs in, the
database exists, and the user holds what the sender needs (DML; DDL with ddl = apply;
the replay-protection tables in meta_database)."""

from __future__ import annotations

from capturer.util.grants import Grants, account
from capturer.util.probe import Outcome, Probe, SenderCheck
from senders.mysql.sender import MySQLSender


def probe(c: SenderCheck) -> Probe:
    opts = c.options
    return Probe(f"sender {c.name} ({opts['host']}:{opts['port']})", lambda out: _target(c, out),
                 f"check host, port, user, password in {c.section}")


def _target(c: SenderCheck, out: Outcome) -> None:
    sender = MySQLSender(c.name, {k: v for k, v in c.options.items() if k != "process"}, c.queue_rows)
    where = f"sender {c.name} ({c.options['host']}:{c.options['port']})"
    try:
        conn = sender.workers[0].connect()  # the sender's own connection and session set-up
        with conn.cursor() as cur:
            cur.execute("SELECT VERSION(), CURRENT_USER()")
            version, user = cur.fetchone()
            acct = account(str(user))
            grants = Grants.read(cur)
            db = c.options["database"]
            need = ["SELECT", "INSERT", "UPDATE", "DELETE"]
            if c.options["ddl"] == "apply":
                need += ["CREATE", "ALTER", "DROP", "INDEX"]
            if db:
                cur.execute("SELECT 1 FROM information_schema.SCHEMATA WHERE SCHEMA_NAME = %s", (db,))
                if cur.fetchone() is None:
                    out.problems.append(f"{where}: database {db!r} (database = in {c.section}) does not exist on the "
                                        f"target, and the sender does not create it: CREATE DATABASE `{db}`")
                lacking = [p for p in need if not grants.on_db(db, p)]
                if lacking:
                    grants.missing(out, where, f"{', '.join(lacking)} on database {db!r}: GRANT "
                                               f"{', '.join(lacking)} ON `{db}`.* TO {acct}")
            else:
                lacking = [p for p in need if not grants.has_global({p})]
                dbs = grants.db_level(set(need))
                if lacking and not dbs:
                    grants.missing(out, where, f"{', '.join(lacking)} (database = is empty: tables go to databases "
                                               f"of the sources' names): GRANT {', '.join(lacking)} ON *.* TO "
                                               f"{acct}, or on those databases")
                elif lacking:
                    out.notes.append(f"{where}: {', '.join(lacking)} are granted on database(s) "
                                     f"{', '.join(sorted(dbs))} only: database = is empty, so tables go to "
                                     "databases of the sources' names; they must be among these")
            meta = c.options["meta_database"]
            if meta and not all(grants.on_db(meta, p) for p in ("CREATE", "SELECT", "INSERT", "UPDATE")):
                out.notes.append(f"{where}: the user cannot keep replay protection in {meta!r} (meta_database): "
                                 "tables without keys are not protected against replays; GRANT CREATE, SELECT, "
                                 f"INSERT, UPDATE ON `{meta}`.* TO {acct}, or set meta_database = to silence this")
        conn.rollback()
        if not out.problems:
            out.detail = f"{version}, user {user}" + (f", database {db}" if db else "")
    finally:
        sender.close()
