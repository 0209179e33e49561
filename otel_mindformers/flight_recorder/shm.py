"""System V shared memory, through the C library (ctypes: no compiled extension).

The flight ring's hot storage (docs/flight_recorder.md): a segment's size is fixed when it is
created, so no other process can shrink it under a store (a file mapping can be cut, and the
next store past the new end is a SIGBUS); another process's `IPC_RMID` only marks it for
removal while we stay attached; and it outlives a process killed with SIGKILL, until someone
removes it, its IPC namespace ends, or the machine reboots.

Linux on a 64-bit little-endian CPU (x86-64, aarch64) only: there `shmid_ds` has the layout
`_SHMID_DS` reads. Anywhere else, or where the C library refuses (a sandbox that forbids
the calls, `kernel.shmmni` reached), every function raises OSError and the ring is a file
alone.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import struct
import sys
import uuid
from dataclasses import dataclass

_IPC_PRIVATE = 0
_IPC_CREAT = 0o1000
_IPC_EXCL = 0o2000
_IPC_RMID, _IPC_STAT = 0, 2
_SHM_RDONLY = 0o10000
_PyBUF_READ, _PyBUF_WRITE = 0x100, 0x200

# struct shmid_ds on 64-bit Linux (glibc and musl, x86-64 and aarch64): ipc_perm's key, uid,
# gid, cuid, cgid, then the mode's low 16 bits (little-endian); shm_segsz at 48; 112 bytes in all.
_PERM = struct.Struct("<iIIIIH")
_SEGSZ, _SHMID_DS = 48, 112

_SUPPORTED = sys.platform == "linux" and sys.byteorder == "little" and platform.machine() in ("x86_64", "aarch64")


def _libc() -> ctypes.CDLL | None:
    if not _SUPPORTED:
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.shmget.argtypes = [ctypes.c_int, ctypes.c_size_t, ctypes.c_int]
        libc.shmget.restype = ctypes.c_int
        libc.shmat.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int]
        libc.shmat.restype = ctypes.c_void_p
        libc.shmdt.argtypes = [ctypes.c_void_p]
        libc.shmdt.restype = ctypes.c_int
        libc.shmctl.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_void_p]
        libc.shmctl.restype = ctypes.c_int
    except (OSError, AttributeError):  # no C library to load, or one without System V IPC
        return None
    return libc


_LIBC = _libc()
_FAILED = ctypes.c_void_p(-1).value  # shmat's (void *) -1
_from_memory = ctypes.pythonapi.PyMemoryView_FromMemory
_from_memory.argtypes = [ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int]
_from_memory.restype = ctypes.py_object


def _error(call: str) -> OSError:
    code = ctypes.get_errno()
    return OSError(code, f"{call}: {os.strerror(code)}")


def _lib() -> ctypes.CDLL:
    if _LIBC is None:
        raise OSError(errno.ENOSYS, f"no System V shared memory on {sys.platform} {platform.machine()}")
    return _LIBC


@dataclass(frozen=True)
class SegmentInfo:
    """What the kernel says of a segment (IPC_STAT)."""

    uid: int  # its owner
    cuid: int  # its creator
    mode: int  # its permission bits
    size: int


def stat(segment_id: int) -> SegmentInfo:
    """IPC_STAT; OSError when there is no such segment (EINVAL, EIDRM) or it is not ours to read (EACCES)."""
    buffer = ctypes.create_string_buffer(_SHMID_DS)
    if _lib().shmctl(segment_id, _IPC_STAT, buffer) != 0:
        raise _error(f"shmctl({segment_id}, IPC_STAT)")
    data = buffer.raw
    _key, uid, _gid, cuid, _cgid, mode = _PERM.unpack_from(data, 0)
    (size,) = struct.unpack_from("<Q", data, _SEGSZ)
    return SegmentInfo(uid, cuid, mode & 0o777, size)


def remove(segment_id: int) -> None:
    """IPC_RMID: gone once the last process attached detaches (at once when none is)."""
    if _lib().shmctl(segment_id, _IPC_RMID, None) != 0:
        raise _error(f"shmctl({segment_id}, IPC_RMID)")


class Attachment:
    """A segment attached to this process: `view` is its memory, a memoryview of bytes.
    After `detach` the view is released (any use raises ValueError, never touches memory
    that is gone); views cast or sliced from it must be released before."""

    def __init__(self, segment_id: int, size: int, *, readonly: bool = False) -> None:
        address = _lib().shmat(segment_id, None, _SHM_RDONLY if readonly else 0)
        if address is None or address == _FAILED:
            raise _error(f"shmat({segment_id})")
        self.id = segment_id
        self._address = address
        self.view: memoryview = _from_memory(address, size, _PyBUF_READ if readonly else _PyBUF_WRITE)

    def detach(self) -> None:
        self.view.release()
        if _lib().shmdt(self._address) != 0:
            raise _error("shmdt")


def create(size: int) -> Attachment:
    """A new private segment of `size` bytes, mode 0600, attached, every page of it touched
    (allocated now: a store later never needs memory); OSError where the system refuses one."""
    segment_id = _lib().shmget(_IPC_PRIVATE, size, _IPC_CREAT | _IPC_EXCL | 0o600)
    if segment_id < 0:
        raise _error(f"shmget({size} bytes)")
    try:
        attachment = Attachment(segment_id, size)
    except OSError:
        remove(segment_id)
        raise
    attachment.view[:] = bytes(size)
    return attachment


def read(segment_id: int, size: int) -> bytes:
    """A copy of a segment's `size` first bytes, attached read-only for the copy."""
    attachment = Attachment(segment_id, size, readonly=True)
    try:
        return bytes(attachment.view)
    finally:
        attachment.detach()


def namespace() -> tuple[bytes, int]:
    """(this boot's id, this IPC namespace's inode): where a segment id means a segment. A
    ring written under another pair (another host, a container that ended, a reboot) names
    one that is not here. Zeros where /proc does not say."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as stream:
            boot = uuid.UUID(stream.read().strip()).bytes
        return boot, os.stat("/proc/self/ns/ipc").st_ino
    except (OSError, ValueError):
        return bytes(16), 0


__all__ = ["Attachment", "SegmentInfo", "create", "namespace", "read", "remove", "stat"]
