"""A loopback TCP proxy, run as a process of its own so that a test can cut the link it carries
(SIGSTOP: connections stay open, nothing passes either way, as in a network partition) and heal
it (SIGCONT). ``python -m tests.support.tcp_proxy LISTEN_PORT TARGET_PORT [LISTEN_HOST]``; prints
``ready``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(OSError):
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    writer.close()


async def _serve(listen: int, target: int, host: str) -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", target)
        except OSError:
            writer.close()
            return
        await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))

    server = await asyncio.start_server(handle, host, listen)
    print("ready", flush=True)
    async with server:
        await server.serve_forever()


class Link:
    """A proxy process between a component and the test's Redis."""

    def __init__(self, listen: int, target: int, host: str = "127.0.0.1") -> None:
        self.port, self.host = listen, host
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.support.tcp_proxy", str(listen), str(target), host],
            stdout=subprocess.PIPE,
        )
        assert self.proc.stdout is not None
        assert self.proc.stdout.readline().strip() == b"ready"

    @contextlib.contextmanager
    def cut(self) -> Iterator[None]:
        """Nothing passes inside the block; everything waiting passes after it."""
        os.kill(self.proc.pid, signal.SIGSTOP)
        try:
            yield
        finally:
            os.kill(self.proc.pid, signal.SIGCONT)

    def close(self) -> None:
        os.kill(self.proc.pid, signal.SIGCONT)
        self.proc.kill()
        self.proc.wait(timeout=10)


if __name__ == "__main__":
    host = sys.argv[3] if len(sys.argv) > 3 else "127.0.0.1"
    asyncio.run(_serve(int(sys.argv[1]), int(sys.argv[2]), host))
