"""Frames: one length-prefixed pickle per message over a Unix stream socket.

The reward processes talk this way: the scorer with its workers (:mod:`lit_rlvr.rewards.scorer`)
and each process with its worker launcher (:mod:`lit_rlvr.rewards.launcher`), which also hands
file descriptors over with a frame (``SCM_RIGHTS``, attached to its first byte). A frame is a
4-byte big-endian length, then the pickle.
"""

from __future__ import annotations

import os
import pickle
import socket
import struct

HEADER = struct.Struct("!I")


def send(sock: socket.socket, obj, fds=()) -> None:
    """Write ``obj`` as one frame, whole, with ``fds`` attached to its first byte."""
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    frame = memoryview(HEADER.pack(len(data)) + data)
    sent = socket.send_fds(sock, [frame], list(fds)) if fds else 0
    sock.sendall(frame[sent:])


def recv(sock: socket.socket, max_fds: int = 0) -> tuple[object, list[int]]:
    """Read one frame from a blocking socket: the object and the file descriptors sent with it (at
    most ``max_fds``). ``EOFError`` when the peer is gone, also in the middle of a frame."""
    if max_fds:
        head, fds, _, _ = socket.recv_fds(sock, HEADER.size, max_fds)
    else:
        head, fds = sock.recv(HEADER.size), []
    try:
        if not head:
            raise EOFError("the peer closed the socket")
        head += _exactly(sock, HEADER.size - len(head))
        (size,) = HEADER.unpack(head)
        return pickle.loads(_exactly(sock, size)), fds
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise


def _exactly(sock: socket.socket, size: int) -> bytes:
    chunks, left = [], size
    while left:
        chunk = sock.recv(min(left, 1 << 20))
        if not chunk:
            raise EOFError(f"the peer closed the socket {left} bytes before the end of a {size}-byte frame")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


class FrameReader:
    """Read side of a socket polled for readiness: turn whatever bytes are available into frames."""

    def __init__(self, sock: socket.socket):
        self.sock, self.buffer = sock, bytearray()

    def read_available(self) -> list:
        """All complete frames now available (call when the socket is readable); EOFError at EOF."""
        data = self.sock.recv(1 << 20)
        if not data:
            raise EOFError
        self.buffer += data
        frames, offset = [], 0
        while len(self.buffer) - offset >= HEADER.size:
            (size,) = HEADER.unpack_from(self.buffer, offset)
            if len(self.buffer) - offset - HEADER.size < size:
                break
            start = offset + HEADER.size
            frames.append(pickle.loads(bytes(self.buffer[start : start + size])))
            offset = start + size
        del self.buffer[:offset]
        return frames
