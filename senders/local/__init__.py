"""The local file sender, and reading its files back (replay)."""

from senders.kind import SenderKind

KIND = SenderKind("local", "senders.local.sender:LocalSender", verify="senders.local.verify:FileReader",
                  check="senders.local.check", doc="a local file of JSON lines")
