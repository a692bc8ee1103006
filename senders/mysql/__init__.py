"""The MySQL sender and its row-conflict detection."""

from senders.kind import SenderKind

KIND = SenderKind("mysql", "senders.mysql.sender:MySQLSender", verify="senders.mysql.verify:MySQLTargetReader",
                  check="senders.mysql.check", doc="a MySQL/MariaDB target (SQL built from the rows)")
