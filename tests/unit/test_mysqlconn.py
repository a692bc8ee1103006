"""capturer.util.mysqlconn: one preferred-mode TLS context per process, as pymysql's own."""

from __future__ import annotations

import ssl

import pymysql

from capturer.util import mysqlconn


def test_connections_share_the_preferred_tls_context_and_keep_pymysqls_settings() -> None:
    a = mysqlconn.connect(host="127.0.0.1", port=9, defer_connect=True)
    b = mysqlconn.connect(host="127.0.0.1", port=9, defer_connect=True)
    own = pymysql.connect(host="127.0.0.1", port=9, defer_connect=True)  # pymysql: a new context each time
    assert a.ssl and not a._ssl_required  # still "preferred": TLS where the server offers it
    assert a.ctx is b.ctx and own.ctx is not a.ctx
    for attr in ("verify_mode", "check_hostname", "verify_flags", "minimum_version", "options"):
        assert getattr(a.ctx, attr) == getattr(own.ctx, attr), attr
    assert a.ctx.verify_mode == ssl.CERT_NONE
    # TLS options of its own: a context of its own, TLS required, as with pymysql
    c = mysqlconn.connect(host="127.0.0.1", port=9, defer_connect=True, ssl_verify_cert=False,
                          ssl={"check_hostname": False})
    assert c.ctx is not a.ctx and c._ssl_required
    # TLS off: no context at all
    assert not mysqlconn.connect(host="127.0.0.1", port=9, defer_connect=True, ssl_disabled=True).ssl
