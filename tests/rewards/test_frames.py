"""Frames between reward processes: a length-prefixed pickle, whole at the other end however the
bytes arrive, file descriptors handed over with it, and the peer's end (also mid-frame) an EOFError."""

from __future__ import annotations

import os
import pickle
import socket
import threading

import pytest

from lit_rlvr.rewards import frames


def test_a_frame_larger_than_the_socket_buffer_arrives_whole_with_its_file_descriptors(tmp_path):
    a, b = socket.socketpair()
    payload = {"env": "x" * (4 * a.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF)), "n": [1, 2.5, None]}
    path = tmp_path / "f"
    path.write_text("hello")
    fd = os.open(path, os.O_RDONLY)
    sender = threading.Thread(target=frames.send, args=(a, payload, [fd]))  # blocks until b reads
    sender.start()
    got, fds = frames.recv(b, max_fds=3)
    sender.join()
    assert got == payload and len(fds) == 1
    assert os.fstat(fds[0]).st_ino == os.fstat(fd).st_ino and os.read(fds[0], 5) == b"hello"
    os.close(fd), os.close(fds[0])
    frames.send(a, "second")
    assert frames.recv(b) == ("second", [])
    a.close(), b.close()


def test_the_frame_reader_returns_complete_frames_whatever_the_byte_boundaries():
    a, b = socket.socketpair()
    objects = [("ready",), (3, 1.0, "ok", "", "42", False), None, "y" * 5000]
    wire = b"".join(frames.HEADER.pack(len(d)) + d for d in (pickle.dumps(o) for o in objects))
    reader, got = frames.FrameReader(b), []
    for cut in range(0, len(wire), 7):  # 7 bytes at a time: headers and pickles split everywhere
        a.sendall(wire[cut : cut + 7])
        got += reader.read_available()
    assert got == objects
    a.close()
    with pytest.raises(EOFError):
        reader.read_available()
    b.close()


def test_a_peer_that_ends_inside_a_frame_is_an_eof_and_its_file_descriptors_are_closed(tmp_path):
    a, b = socket.socketpair()
    frames.send(a, "complete")
    fd = os.open(tmp_path, os.O_RDONLY)
    socket.send_fds(a, [frames.HEADER.pack(100) + b"only part"], [fd])
    os.close(fd)
    a.close()
    assert frames.recv(b, max_fds=1) == ("complete", [])
    before = set(os.listdir("/proc/self/fd"))
    with pytest.raises(EOFError, match="91 bytes before the end of a 100-byte frame"):
        frames.recv(b, max_fds=1)
    assert set(os.listdir("/proc/self/fd")) <= before  # the descriptor that came with it is closed
    with pytest.raises(EOFError, match="closed the socket"):
        frames.recv(b)
    b.close()
