"""Output memory: the blocks a kernel call's outputs live in.  A call
returns new arrays, as numpy does; an output of ``REUSE_MIN_BYTES`` or more
is written into a block that an earlier output of the same size left when
the caller let go of it.

Why: a fresh block's pages are mapped on first touch, each zeroed by the
operating system, and malloc hands blocks this large (above its mmap
threshold, 32 MiB at most) back to the system when they are freed, so
every call would pay again, as long as a kernel over such data takes,
and with several threads faulting at once the wait varies widely
(``benchmarks/README.md``).  Smaller blocks come from malloc's heap,
which keeps freed memory itself.

A block is lent behind a sentinel (a ctypes view of it) that every array
made from it references; when the last of them is gone, the sentinel's
finaliser gives the block back.  Blocks given back are kept up to
``1 / KEEP_SHARE`` of the machine's memory; beyond that they are freed.
"""
from __future__ import annotations

import ctypes
import os
import threading
import weakref

import numpy as np

REUSE_MIN_BYTES = 1 << 22    # numpy's threshold for huge pages; smaller blocks come from malloc's heap
KEEP_SHARE = 16              # blocks kept for reuse: at most this fraction of the machine's memory


def memory_bytes() -> int | None:
    """This machine's memory in bytes; None where POSIX cannot say."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None


class _Blocks:
    """Blocks given back, by size; a reentrant lock, as a finaliser may run
    (garbage collection) while this thread is inside :meth:`lend`."""

    def __init__(self, keep_bytes: int):
        self.free = {}
        self.kept = 0
        self.keep_bytes = keep_bytes
        self.lock = threading.RLock()

    def lend(self, nbytes: int) -> np.ndarray:
        """A writable uint8 array of ``nbytes`` (uninitialised, as ``np.empty``)."""
        with self.lock:
            blocks = self.free.get(nbytes)
            block = blocks.pop() if blocks else None
            if block is not None:
                self.kept -= nbytes
        if block is None:
            block = np.empty(nbytes, np.uint8)
        sentinel = (ctypes.c_char * nbytes).from_buffer(block)
        weakref.finalize(sentinel, self._give_back, block).atexit = False
        return np.frombuffer(sentinel, np.uint8)

    def _give_back(self, block: np.ndarray):
        with self.lock:
            if self.kept + block.nbytes <= self.keep_bytes:
                self.free.setdefault(block.nbytes, []).append(block)
                self.kept += block.nbytes


_BLOCKS = _Blocks((memory_bytes() or 1 << 32) // KEEP_SHARE)     # unknown: what a small machine could keep


def block(nbytes: int) -> np.ndarray:
    """An uninitialised uint8 array of ``nbytes`` for a call's output: a
    block given back by an earlier output when it is large enough to pay."""
    return _BLOCKS.lend(nbytes) if nbytes >= REUSE_MIN_BYTES else np.empty(nbytes, np.uint8)
