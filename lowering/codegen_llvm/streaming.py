"""Streaming stores: full vectors into a large output that no stage reads
back are written past the caches (non-temporal stores, an ``sfence`` at the
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


class StreamingStores:
    """The emitter's streaming stores (a mixin of ``emitter.FunctionEmitter``)."""

    def _vector_store(self, buf, base, value, ptr):
        """A full vector store (one register or several: ``Blocking.math_chains``), a
        candidate for a non-temporal one (past the caches, no read for
        ownership: :meth:`_mark_streaming`) into a large output no stage
        reads, at an element aligned to the vector (outputs are allocated
        64-byte aligned)."""
        form = linear_form(base)
        lanes = value.type.count
        candidate = (self.target.streaming_stores and buf.kind == "output"
                     and buf.nbytes >= stream_min_bytes(self.target) and buf not in self.loaded
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
