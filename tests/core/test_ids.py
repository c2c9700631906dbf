"""Public ids (``gateway.core.ids``): time-ordered, unguessable, never handed out twice."""

from __future__ import annotations

import os
import re
import signal
import time

from gateway.core import ids


def _random_part(value: str) -> str:
    return value.split("_", 1)[1][12:]


def test_ids_are_time_ordered_hex_and_unique() -> None:
    minted = [ids.new_id("resp") for _ in range(5000)]
    assert all(re.fullmatch(r"resp_[0-9a-f]{12}[0-9a-f]{36}", value) for value in minted)
    assert len(set(minted)) == len(minted)
    assert len({_random_part(value) for value in minted}) == len(minted)
    assert [value[5:17] for value in minted] == sorted(value[5:17] for value in minted)
    assert re.fullmatch(r"msg_[0-9a-f]{12}[0-9a-f]{8}", ids.new_id("msg", 4))
    assert len(_random_part(ids.new_id("big", 5000))) == 10000  # more than one buffer: drawn apart


def test_a_forked_child_never_repeats_its_parents_random_bytes() -> None:
    """The random bytes are drawn from the OS a buffer at a time; a child process (uvicorn's and
    Celery's workers fork) must not hand out the bytes its parent hands out next."""
    ids.new_id("resp")  # the parent's buffer is filled
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child
        try:
            os.write(write, ids.new_id("resp").encode())
        finally:
            os._exit(0)
    os.close(write)
    child = os.read(read, 200).decode()
    os.close(read)
    os.waitpid(pid, 0)
    parent = ids.new_id("resp")
    assert child.startswith("resp_") and _random_part(child) != _random_part(parent)


def test_a_child_forked_while_another_thread_mints_an_id_can_mint_its_own() -> None:
    """A lock another thread of the parent held at the fork is never released in the child: the
    child gets a new one."""
    read, write = os.pipe()
    with ids._random.lock:  # as another thread minting an id at the moment of the fork
        pid = os.fork()
        if pid == 0:  # the child
            try:
                os.write(write, ids.new_id("resp").encode())
            finally:
                os._exit(0)
    os.close(write)
    os.set_blocking(read, False)
    child = b""
    for _ in range(200):
        try:
            child = os.read(read, 200)
            break
        except BlockingIOError:
            time.sleep(0.01)
    os.close(read)
    if not child:
        os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    assert child.startswith(b"resp_"), "the child could not mint an id (it waited on its parent's lock)"
