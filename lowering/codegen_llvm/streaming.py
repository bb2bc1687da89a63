"""Streaming stores: full vectors into a large output that no stage reads
back, or into a buffer too large for the caches a kernel's threads can count
on, are written past the caches (non-temporal stores, an ``sfence`` at the
stage's end) when they write whole cache lines, which skips the read for
ownership a cached store costs."""
from __future__ import annotations

from llvmlite import ir

from ..loop_ir import linear_form
from ..target import Target
from .llvm_types import I32, ITEMSIZE, element_align


def stream_min_bytes(target: Target) -> int:
    """Outputs at least this large (the power of two at or above L2: they
    would evict the stage's working set) are written with streaming stores."""
    return 1 << (target.l2_bytes - 1).bit_length()


def stream_beyond_bytes(target: Target) -> int:
    """Buffers at least this large (every thread's L2 and share of L3) are
    written with streaming stores even when a later stage reads them: the
    caches the kernel can count on lose their first lines before the stage
    ends, so the reader fetches them from memory either way, and the
    writes skip the read for ownership (attention's T x T temporaries).
    A scan's state is read by the stage that writes it, so it stays cached."""
    return (target.l2_bytes + target.l3_bytes) * target.threads


class StreamingStores:
    """The emitter's streaming stores (a mixin of ``emitter.FunctionEmitter``)."""

    def _vector_store(self, buf, base, value, ptr):
        """A full vector store (one register or several: ``Blocking.math_chains``), a
        candidate for a non-temporal one (past the caches, no read for
        ownership: :meth:`_mark_streaming`) into a large output no stage
        reads, or a buffer beyond the caches (:func:`stream_beyond_bytes`)
        this stage does not read, at an element aligned to the vector
        (buffers are allocated 64-byte aligned)."""
        form = linear_form(base)
        lanes = value.type.count
        beyond = buf.nbytes >= stream_beyond_bytes(self.target) and buf not in self.read_here
        written_once = buf.kind == "output" and buf.nbytes >= stream_min_bytes(self.target) and buf not in self.loaded
        candidate = (self.target.streaming_stores and (written_once or beyond)
                     and lanes * ITEMSIZE[buf.dtype] % self.target.vector_bytes == 0 and form is not None
                     and all(k % lanes == 0 for k in form[0].values()) and form[1] % lanes == 0)
        if not candidate:
            return self.b.store(value, ptr, align=element_align(buf))
        st = self.b.store(value, ptr, align=self.target.vector_bytes)
        self.stream.append((st, buf, form, lanes, tuple(self.loops)))
        return st

    def _mark_streaming(self) -> bool:
        """Make non-temporal the candidate stores that write whole cache lines,
        and say whether there are any.  A vector narrower than a line (AVX2's
        32 bytes, 64-byte lines) streams only when the line's other vectors
        are stored in the same iteration (a register tile's row) or by the
        next iteration of the innermost loop that moves the store (a row
        written in order).  A store that leaves a line half written (a
        transposed tile: the next store goes to another row) would make the
        processor's few write-combining buffers flush partial lines, slower
        than writing through the caches."""
        offsets = {}
        for _, buf, (terms, c), _, _ in self.stream:
            offsets.setdefault((buf, frozenset(terms.items())), set()).add(c)
        streamed = False
        for st, buf, (terms, c), lanes, loops in self.stream:
            line = self.target.cache_line // ITEMSIZE[buf.dtype]
            vectors = max(line // lanes, 1)
            same = offsets[(buf, frozenset(terms.items()))]
            whole_line = (vectors == 1 or all(k % line == 0 for k in terms.values())
                          and all(c - c % line + lanes * v in same for v in range(vectors)))
            moving = next((terms.get(v, 0) for v in reversed(loops) if terms.get(v, 0)), 0)
            if whole_line or moving == lanes:
                st.set_metadata("nontemporal", self.module.add_metadata([ir.Constant(I32, 1)]))
                streamed = True
        return streamed
