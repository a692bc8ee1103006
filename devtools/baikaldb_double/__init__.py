"""A BaikalDB test double: meta servers and stores as real HTTP servers on
127.0.0.1 (brpc's HTTP+JSON rules), the store's OP_READ_BINLOG semantics, and
fault injection. No BaikalDB server can be installed on this machine; this is
what the BaikalDB region is tested against (besides the real 2020 payloads in
tests/unit/test_baikaldb_golden.py)."""

from .cluster import TYPES, Cluster, Table, Txn, insert_keyless  # noqa: F401
from .server import BaikalDouble, free_port  # noqa: F401
