"""Output memory: the blocks a kernel call's outputs live in.  A call
returns new arrays, as numpy does; an output of ``REUSE_MIN_BYTES`` or more
is written into a block that an earlier output of the same size left when
the caller let go of it.

Why: a fresh block's pages are mapped on first touch, each zeroed by the
operating system, and malloc may hand a large block back to the system
when it is freed: above its mmap threshold (glibc's starts at 128 KiB and
follows the largest block freed, up to 32 MiB), or when the free memory at
the top of its heap passes twice that threshold (two outputs of 2 MiB freed
together).  Every call would then pay again, a fault per page, as long
as a kernel over such data takes, and with several threads faulting at
once the wait varies widely (``benchmarks/README.md``).

A block is lent behind a sentinel (a ctypes view of it) that every array
made from it references; when the last of them is gone, a weak reference's
callback gives the block back.  A lend and its return cost a few
Python calls, about as much as faulting in one page: from
``REUSE_MIN_BYTES`` (256 pages) on, lending costs under 1% of what it can
save; smaller blocks stay with malloc, which mostly keeps them (a lend
would add more to a short kernel than malloc's rare return).  Blocks given
back are kept up to ``1 / KEEP_SHARE`` of the machine's memory; beyond that
they are freed.
"""
from __future__ import annotations

import ctypes
import os
import threading
import weakref

import numpy as np

REUSE_MIN_BYTES = 1 << 20    # 256 pages: a lend costs under 1% of the faults it can save (module doc)
KEEP_SHARE = 16              # blocks kept for reuse: at most this fraction of the machine's memory


def memory_bytes() -> int | None:
    """This machine's memory in bytes; None where POSIX cannot say."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None


class _Blocks:
    """Blocks given back, by size; a reentrant lock, as a callback may run
    (garbage collection) while this thread is inside :meth:`lend`."""

    def __init__(self, keep_bytes: int):
        self.free = {}
        self.kept = 0
        self.keep_bytes = keep_bytes
        self.lock = threading.RLock()
        self.lent = {}              # id of a weak reference to a sentinel -> (the reference, its block)

    def lend(self, nbytes: int) -> np.ndarray:
        """A writable uint8 array of ``nbytes`` (uninitialised, as ``np.empty``)."""
        with self.lock:
            blocks = self.free.get(nbytes)
            if blocks:
                block = blocks.pop()
                self.kept -= nbytes
            else:
                block = np.empty(nbytes, np.uint8)
            sentinel = (ctypes.c_char * nbytes).from_buffer(block)
            ref = weakref.ref(sentinel, self._give_back)
            self.lent[id(ref)] = ref, block
        return np.frombuffer(sentinel, np.uint8)

    def _give_back(self, ref):
        with self.lock:
            _, block = self.lent.pop(id(ref))
            if self.kept + block.nbytes <= self.keep_bytes:
                self.free.setdefault(block.nbytes, []).append(block)
                self.kept += block.nbytes


_BLOCKS = _Blocks((memory_bytes() or 1 << 32) // KEEP_SHARE)     # unknown: what a small machine could keep


def block(nbytes: int) -> np.ndarray:
    """An uninitialised uint8 array of ``nbytes`` for a call's output: a
    block given back by an earlier output when it is large enough to pay."""
    return _BLOCKS.lend(nbytes) if nbytes >= REUSE_MIN_BYTES else np.empty(nbytes, np.uint8)
