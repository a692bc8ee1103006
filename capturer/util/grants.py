"""What ``SHOW GRANTS`` says a MySQL/MariaDB user holds: read by the preflight checks
of the MySQL/MariaDB region (replication, SELECT for snapshots) and of the MySQL
sender (DML and DDL on the target)."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from capturer.util.probe import Outcome

# an object's part: quoted (a name may hold spaces, dots, quotes doubled), *, or bare
_PART = r"(?:`(?:[^`]|``)*`|'(?:[^']|'')*'|\"(?:[^\"]|\"\")*\"|\*|[^\s.`'\"]+)"
_GRANT = re.compile(r"^GRANT\s+(.+?)\s+ON\s+(?:(?:TABLE|FUNCTION|PROCEDURE|PACKAGE(?:\s+BODY)?)\s+)?"
                    rf"({_PART})(?:\.({_PART}))?\s+TO\s", re.I | re.S)


def account(user: str) -> str:
    """``CURRENT_USER()`` (``name@host``) as a GRANT statement names it."""
    name, _, host = user.rpartition("@")
    return f"'{name}'@'{host}'" if name else f"'{user}'"


@dataclass
class Grants:
    """What ``SHOW GRANTS`` says the current user holds: global privileges, and per
    database (a LIKE pattern). Column and table grants are not counted (they never
    cover a whole database). Roles: their grants are what the server lists."""

    global_: set[str] = field(default_factory=set)
    dbs: dict[str, set[str]] = field(default_factory=dict)
    roles: bool = False
    readable: bool = True

    @classmethod
    def read(cls, cur: Any) -> Grants:
        import pymysql

        try:
            cur.execute("SHOW GRANTS")
            lines = [str(r[0]) for r in cur.fetchall()]
        except pymysql.err.MySQLError:
            return cls(readable=False)
        return cls.parse(lines)

    @classmethod
    def parse(cls, lines: Iterable[str]) -> Grants:
        g = cls()
        for line in lines:
            m = _GRANT.match(line.strip())
            if m is None:
                if re.match(r"^GRANT\s+\S+\s+TO\s", line.strip(), re.I):
                    g.roles = True  # GRANT role TO user
                continue
            privs = {p.strip().upper() for p in re.sub(r"\([^)]*\)", "", m.group(1)).split(",")}
            if privs & {"ALL", "ALL PRIVILEGES"}:
                privs.add("ALL")
            db, table = m.group(2), m.group(3) or ""
            if db == "*" and table == "*":
                g.global_ |= privs
            elif table == "*":
                g.dbs.setdefault(_unquote(db), set()).update(privs)
        return g

    def has_global(self, any_of: set[str]) -> bool:
        return bool(self.global_ & (any_of | {"ALL"}))

    def db_level(self, any_of: set[str]) -> list[str]:
        return [db for db, p in self.dbs.items() if p & (any_of | {"ALL"})]

    def on_db(self, db: str, priv: str) -> bool:
        if self.has_global({priv}):
            return True
        return any(p & {priv, "ALL"} and _like(pattern, db) for pattern, p in self.dbs.items())

    def missing(self, out: Outcome, where: str, what: str) -> None:
        """A privilege not seen: a problem, unless the grants could not be read or
        come through roles (then a note: the check cannot tell)."""
        if not self.readable or self.roles:
            out.notes.append(f"{where}: could not confirm {what} (SHOW GRANTS "
                             f"{'failed' if not self.readable else 'lists roles'})")
        else:
            out.problems.append(f"{where}: the user lacks {what}")


def _unquote(name: str) -> str:
    if len(name) >= 2 and name[0] == name[-1] and name[0] in "`'\"":
        return name[1:-1].replace(name[0] * 2, name[0])
    return name


def _like(pattern: str, name: str) -> bool:
    """SQL LIKE as GRANT uses it for database names (``_``, ``%``, ``\\`` escapes)."""
    rx, i = [], 0
    while i < len(pattern):
        c = pattern[i]
        if c == "\\" and i + 1 < len(pattern):
            rx.append(re.escape(pattern[i + 1]))
            i += 2
            continue
        rx.append("." if c == "_" else ".*" if c == "%" else re.escape(c))
        i += 1
    return re.fullmatch("".join(rx), name, re.S) is not None
