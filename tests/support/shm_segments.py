"""System V shared-memory segments, as the tests see and handle them: the kernel's list
(/proc/sysvipc/shm, the reader's IPC namespace), a segment handed to another owner, and
child processes in an IPC namespace of their own.

The test session runs in an IPC namespace of its own where it may (tests/conftest.py): the
flight rings' segments (docs/flight_recorder.md) that killed trainings leave go when its last
process ends, and a test sees no other session's."""

from __future__ import annotations

import ctypes
import struct
from dataclasses import dataclass

_CLONE_NEWIPC = 0x08000000
_IPC_SET, _IPC_STAT = 1, 2
_SHMID_DS = 112  # struct shmid_ds on 64-bit Linux: the uid at 4, the mode at 20


@dataclass(frozen=True)
class Segment:
    id: int
    size: int
    creator_pid: int
    attached: int
    uid: int
    mode: int  # with SHM_DEST (0o1000) when it is marked for removal


def segments() -> dict[int, Segment]:
    """Every segment of this IPC namespace, by id."""
    with open("/proc/sysvipc/shm") as stream:
        rows = stream.read().splitlines()[1:]
    found = {}
    for row in rows:
        # key shmid perms size cpid lpid nattch uid gid cuid cgid ...
        _key, shmid, perms, size, cpid, _lpid, nattch, uid = row.split()[:8]
        found[int(shmid)] = Segment(int(shmid), int(size), int(cpid), int(nattch), int(uid), int(perms, 8))
    return found


def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.shmctl.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_void_p]
    return libc


def set_owner(segment_id: int, uid: int | None = None, mode: int | None = None) -> None:
    """IPC_SET: the segment now another user's, or open to others (root may, or its owner)."""
    libc = _libc()
    buffer = ctypes.create_string_buffer(_SHMID_DS)
    if libc.shmctl(segment_id, _IPC_STAT, buffer) != 0:
        raise OSError(ctypes.get_errno(), "shmctl(IPC_STAT)")
    if uid is not None:
        struct.pack_into("<I", buffer, 4, uid)
    if mode is not None:
        struct.pack_into("<H", buffer, 20, mode)
    if libc.shmctl(segment_id, _IPC_SET, buffer) != 0:
        raise OSError(ctypes.get_errno(), "shmctl(IPC_SET)")


def own_ipc_namespace() -> bool:
    """This process (its calling thread, and what it starts from then on) in a new IPC
    namespace; False where that is not allowed (no CAP_SYS_ADMIN)."""
    return _libc().unshare(_CLONE_NEWIPC) == 0


def in_own_namespace() -> None:
    """A `preexec_fn`: the child in an IPC namespace of its own, which ends with it, as a
    container's does: a segment it leaves is gone once it dies."""
    if not own_ipc_namespace():
        raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWIPC)")


def without_shared_memory() -> None:
    """A `preexec_fn`: the child in an IPC namespace of its own where the kernel refuses
    every new segment (kernel.shmmni = 0): shmget fails with ENOSPC, as at a system's limit."""
    in_own_namespace()
    with open("/proc/sys/kernel/shmmni", "w") as stream:
        stream.write("0")


__all__ = ["Segment", "in_own_namespace", "own_ipc_namespace", "segments", "set_owner", "without_shared_memory"]
