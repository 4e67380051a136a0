"""Connection placement's moves: a worker of a multi-worker hare-server hands a client
connection to the worker whose queues it uses, and takes the ones handed to it
(docs/ARCHITECTURE.md, "Where connections live"; the rules are broker/server/placement.py's).

Each worker listens on a Unix socket in the abstract namespace, `hare-handover-<parent
pid>-w<i>` (no file to leave behind after a kill -9, no 108-byte path limit under a deep
data directory); a connection's peer must be a sibling: same uid, same parent process
(SO_PEERCRED). A move is one connection on it: 8 bytes (state length, held length) carrying
the client socket's descriptor (SCM_RIGHTS), the reader's state as JSON, and the bytes read
but not handled, from the frame that decided the move; the receiver answers one byte,
b"1" (it serves the connection from now on) or b"0" (refused: the sender goes on serving
it). A receiver that dies before answering took nothing: the sender goes on too. Only after
b"1" does the sender close its descriptor, without shutdown(): the TCP connection lives on
in the other process, and the client never notices."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import struct
from dataclasses import dataclass
from typing import TYPE_CHECKING

import structlog

from broker.server.placement import movable
from broker.server.reader import Reader

if TYPE_CHECKING:
    from broker.node import Node

__all__ = ["Handover", "Siblings"]

log = structlog.get_logger("hare.handover")

_HEAD = struct.Struct(">II")  # state length, held bytes length
# how long a connection waits to become quiet (its channels done with what came before the
# deciding frame, its confirms sent, its writer drained) before it stays where it is
QUIET_S = 1.0
_ANSWER_S = 5.0  # the receiver's answer; past it the connection is theirs (see _send)
_RECEIVE_S = 5.0


@dataclass(frozen=True, slots=True)
class Siblings:
    """The workers of this hare-server: this one's index (1..N), every worker's node name
    (index - 1), and the parent's pid that names their handover sockets."""

    index: int
    names: tuple[str, ...]
    parent: int

    def address(self, index: int) -> str:
        return f"\0hare-handover-{self.parent}-w{index}"


class Handover:
    def __init__(self, node: Node, siblings: Siblings) -> None:
        self.node = node
        self.siblings = siblings
        self._sock: socket.socket | None = None
        self._acceptor: asyncio.Task[None] | None = None
        self._receiving: set[asyncio.Task[None]] = set()
        self.moved_out = 0  # connections handed to another worker
        self.moved_in = 0  # connections taken from another worker
        self.stayed = 0  # decided to move, but not simple or the other worker refused

    async def start(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.bind(self.siblings.address(self.siblings.index))
            sock.listen(64)
        except OSError:
            sock.close()
            raise
        sock.setblocking(False)
        self._sock = sock
        self._acceptor = asyncio.get_running_loop().create_task(self._accept())

    async def stop(self) -> None:
        """Take no more connections (the node is stopping: what it has is closed)."""
        if self._acceptor is not None:
            self._acceptor.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._acceptor
        for task in list(self._receiving):
            task.cancel()
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    # -- sending ----------------------------------------------------------------------------
    async def move(self, reader: Reader, home: str) -> bool:
        """Hand `reader`'s connection to the worker `home` once it is quiet. True: handed
        over (the reader has ended here); False: it stays and handles what it holds."""
        try:
            moved = await self._move(reader, home)
        except Exception:
            log.exception("connection handover failed", conn=reader.name, to=home)
            moved = False
        if not moved:
            self.stayed += 1
        return moved

    async def _move(self, reader: Reader, home: str) -> bool:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + QUIET_S
        while (reason := movable(reader)) is not None:
            if loop.time() > deadline or reason in ("tls", "not open", "consuming",
                                                    "transaction", "exclusive queue"):
                log.debug("connection stays", conn=reader.name, reason=reason, home=home)
                return False
            await asyncio.sleep(0.002)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.setblocking(False)
        try:
            async with asyncio.timeout(1.0):
                await loop.sock_connect(
                    sock, self.siblings.address(self.siblings.names.index(home) + 1))
            if movable(reader) is not None:  # something came while connecting
                return False
            return await self._send(sock, reader, home)
        except (OSError, TimeoutError) as exc:
            log.info("connection stays: its queues' worker is not reachable", conn=reader.name,
                     home=home, error=str(exc))
            return False
        finally:
            sock.close()

    async def _send(self, sock: socket.socket, reader: Reader, home: str) -> bool:
        loop = asyncio.get_running_loop()
        state = json.dumps(reader.handover_state()).encode()
        held = reader.unhandled()
        assert reader.transport is not None
        fd = reader.transport.get_extra_info("socket").fileno()
        socket.send_fds(sock, [_HEAD.pack(len(state), len(held))], [fd])
        try:
            await loop.sock_sendall(sock, state + held)
            async with asyncio.timeout(_ANSWER_S):
                answer = await loop.sock_recv(sock, 1)
        except TimeoutError:
            # it has the descriptor and may be serving: two servers of one socket would be
            # worse than a connection lost, so it is theirs
            answer = b"1"
        except OSError:
            answer = b""  # it died before answering: it took nothing
        if answer != b"1":
            return False
        self.moved_out += 1
        log.info("connection moved", conn=reader.name, to=home)
        reader.handed_over()
        return True

    # -- receiving --------------------------------------------------------------------------
    async def _accept(self) -> None:
        loop = asyncio.get_running_loop()
        assert self._sock is not None
        while True:
            conn, _ = await loop.sock_accept(self._sock)
            task = loop.create_task(self._receive(conn))
            self._receiving.add(task)
            task.add_done_callback(self._receiving.discard)

    def _sibling(self, conn: socket.socket) -> bool:
        pid, uid, _ = struct.unpack("3i", conn.getsockopt(
            socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
        if uid != os.getuid():
            return False
        try:
            stat = open(f"/proc/{pid}/stat").read()  # noqa: SIM115
        except OSError:
            return False
        return int(stat.rsplit(")", 1)[1].split()[1]) == self.siblings.parent

    async def _receive(self, conn: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        fds: list[int] = []
        try:
            with conn:
                if not self._sibling(conn):
                    log.warning("handover refused: not a worker of this server")
                    return
                async with asyncio.timeout(_RECEIVE_S):
                    head = await _recv_fds(loop, conn, _HEAD.size, fds)
                    n_state, n_held = _HEAD.unpack(head)
                    blob = await _recv_exactly(loop, conn, n_state + n_held)
                if len(fds) != 1:
                    return
                fd = fds.pop()
                client = socket.socket(fileno=fd)
                reader = Reader(self.node)
                try:
                    reader.moved_in(json.loads(blob[:n_state]), blob[n_state:])
                except (KeyError, StopIteration, ValueError) as exc:
                    log.warning("handover refused", error=repr(exc))
                    client.close()  # our descriptor only: the sender keeps serving it
                    await loop.sock_sendall(conn, b"0")
                    return
                self.node.connection_opened(reader)  # counted here before the sender drops it
                with contextlib.suppress(OSError):
                    # a sender gone meanwhile (timed out, or died) has given it up: ours
                    await loop.sock_sendall(conn, b"1")
                self.moved_in += 1
                log.info("connection moved in", conn=reader.name)
                try:
                    await loop.connect_accepted_socket(lambda: reader, client)
                except BaseException:
                    self.node.connection_closed(reader)
                    client.close()
                    raise
        except (OSError, TimeoutError, asyncio.IncompleteReadError) as exc:
            log.warning("handover not received", error=repr(exc))
        finally:
            for fd in fds:
                os.close(fd)


async def _readable(loop: asyncio.AbstractEventLoop, sock: socket.socket) -> None:
    fut: asyncio.Future[None] = loop.create_future()

    def ready() -> None:
        if not fut.done():
            fut.set_result(None)

    loop.add_reader(sock.fileno(), ready)
    try:
        await fut
    finally:
        loop.remove_reader(sock.fileno())


async def _recv_fds(loop: asyncio.AbstractEventLoop, sock: socket.socket, n: int,
                    fds: list[int]) -> bytes:
    """n bytes and the descriptors that came with them (appended to `fds` as they come,
    so the caller closes them whatever happens)."""
    data = b""
    while len(data) < n:
        try:
            part, got, _, _ = socket.recv_fds(sock, n - len(data), 4)
        except BlockingIOError:
            await _readable(loop, sock)
            continue
        fds.extend(got)
        if not part:
            raise asyncio.IncompleteReadError(data, n)
        data += part
    return data


async def _recv_exactly(loop: asyncio.AbstractEventLoop, sock: socket.socket, n: int) -> bytes:
    parts: list[bytes] = []
    left = n
    while left:
        part = await loop.sock_recv(sock, min(left, 1 << 20))
        if not part:
            raise asyncio.IncompleteReadError(b"".join(parts), n)
        parts.append(part)
        left -= len(part)
    return b"".join(parts)
