"""The small error hierarchy. Every error says where it comes from."""

from __future__ import annotations


class CapturerError(Exception):
    """Base class for errors the capturer reports to the user."""


class ConfigError(CapturerError):
    """Bad configuration: names the file, section, key and line. Exit code 2."""


class CheckpointError(CapturerError):
    """The checkpoint file cannot be read or trusted. Start-up stops."""


class SourceError(CapturerError):
    """A region cannot be read (connection, server settings, decoding)."""


class FatalSourceError(SourceError):
    """A region problem that retrying will not fix (e.g. binlog_format is not ROW)."""


class SinkError(CapturerError):
    """A sender could not deliver. ``retriable`` says whether trying again may help;
    ``poll`` (seconds), that it waits for something that ends on its own (a lock
    another process holds): tried again that often, without the growing back-off."""

    def __init__(self, msg: str, retriable: bool = True, poll: float | None = None):
        super().__init__(msg)
        self.retriable = retriable
        self.poll = poll


#: every Fenced message says it (it crosses a sender process's pipe as text)
FENCED_MARK = "another capturer took over"


class Fenced(SinkError):
    """High availability: this capturer lost its lease (another one may be active):
    nothing more may be written anywhere. Never retried."""

    def __init__(self, msg: str):
        super().__init__(msg, retriable=False)
