"""Stages that are one loop nest over other buffers: their shared template.

An unrolled recurrence lowers to a stage per step, each the same loop nest
over other buffers, and at another constant offset into a buffer they share
(step ``t`` reads ``X[t]``, one row further along ``X``).  :func:`form`
strips a stage of what makes it one instance: its buffers become numbered
slots, its locals numbered names, its linear indices sums in one order (in
the key), and the constant that every index into a slot has in common moves
into the slot's pointer.  Stages with equal
:attr:`Form.key` are one :func:`template` over the slots, called with
different pointers: the schedule runs once per template
(``schedule/__init__.py``) and LLVM compiles one function for it
(``codegen_llvm/``), so an unrolled program costs about as much to build
as its distinct steps.

Two promises the template makes hold for every instance:

* alignment: an offset moves into a pointer only when it is a multiple of
  ``align_bytes`` (the target's buffer alignment), or for an input (whose
  alignment is never assumed);
* bounds: a slot whose indices are linear is flat in the template and holds
  the fewest elements any instance has past its pointer, so an index proved in range
  there is in range in every instance (the schedule's bounds proofs, LLVM's
  ``dereferenceable``).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from te_autodiff.expr import add, const, mod

from .loop_ir import (AlignGap, Buffer, Stage, Store, from_linear, linear_form, loads_in, map_stmt,
                      stage_buffers, stmt_exprs, stmt_text, substituter, walk, with_load)


@dataclass(frozen=True)
class Form:
    """A stage as an instance of its template: ``slots`` pairs each of its
    buffers (first-use order, :func:`~lowering.loop_ir.stage_buffers`) with
    the element offset of the slot's pointer into it; stages with equal
    ``key`` are instances of one template."""

    stage: Stage
    key: tuple
    slots: tuple


def _offsets(stage: Stage, buffers: list, align_bytes: int) -> dict:
    """Per buffer, the constant all its indices in ``stage`` share that can
    move into its pointer (0 when none can), or None when an index is not
    linear (the slot keeps the buffer's shape)."""
    least, fixed = {}, set()

    def see(buf, index):
        form = linear_form(index)
        if form is None:
            fixed.add(buf)
        else:
            least[buf] = min(least.get(buf, form[1]), form[1])

    visited = set()
    for s in walk(stage.body):
        if isinstance(s, Store):
            see(s.buffer, s.index)
        for load in loads_in(stmt_exprs(s), visited):
            see(load.buffer, load.index)
    out = {}
    for buf in buffers:
        off = least.get(buf, 0)
        item = np.dtype(buf.dtype).itemsize
        movable = buf.kind == "input" or off * item % align_bytes == 0
        out[buf] = None if buf in fixed else off if off > 0 and movable and off < buf.size else 0
    return out


def _rewrite(body, buffer_map: dict, shift: dict):
    """``body`` with each buffer ``b`` of ``buffer_map`` replaced by
    ``buffer_map[b]`` and ``shift[b]`` added to its indices."""
    def index(buf, i):
        d = shift.get(buf, 0)
        if not d:
            return i
        terms, constant = linear_form(i)
        return from_linear(terms, constant + d, i.dtype)

    def load(x):
        if x.buffer not in buffer_map:
            return x
        return with_load(x, buffer_map[x.buffer], index(x.buffer, x.index))

    def gap(x):
        if not isinstance(x, AlignGap) or x.buffer not in buffer_map:
            return x
        # the old buffer starts shift[b] elements into the new one: its gap is that much less
        new, n = AlignGap(buffer_map[x.buffer], x.bytes), x.bytes // x.buffer.itemsize
        back = -shift.get(x.buffer, 0) % n
        return new if back == 0 else mod(add(new, const(back, "int64")), const(n, "int64"))

    expr = substituter({}, load, gap)

    def store(s, expr):
        return Store(buffer_map.get(s.buffer, s.buffer), index(s.buffer, expr(s.index)), expr(s.value))

    return map_stmt(body, expr, store=store)


def _canonical(stage: Stage, slots: tuple, sizes: dict) -> Stage:
    """``stage`` over its slots: buffer ``k`` becomes ``s<k>`` (flat, of
    ``sizes[k]`` elements, when ``k`` is in ``sizes``), its indices shifted
    back by the offset."""
    buffer_map = {}
    for k, (buf, off) in enumerate(slots):
        shape = (sizes[k],) if k in sizes else buf.shape
        buffer_map[buf] = Buffer(f"s{k}", shape, buf.dtype, buf.kind)
    shift = {buf: -off for buf, off in slots if off}
    body = _rewrite(stage.body, buffer_map, shift)
    step = None if stage.step is None else replace(stage.step, counter=buffer_map[stage.step.counter])
    return Stage(stage.name, buffer_map[stage.buffer], body, stage.fixed, None, step)


def form(stage: Stage, align_bytes: int, read: frozenset = frozenset()) -> Form:
    """``stage``'s :class:`Form`.  ``read``: buffers some stage reads (a slot's
    flag in the key: whether its stores may bypass the caches depends on it)."""
    buffers, _ = stage_buffers(stage)
    offsets = _offsets(stage, buffers, align_bytes)
    slots = tuple((buf, offsets[buf] or 0) for buf in buffers)
    text = stmt_text(stage.body, typed=True, slots={buf: (f"s{k}", off) for k, (buf, off) in enumerate(slots)})
    # a slot whose indices are linear is flat in the template, whatever its
    # offset: the first step's X[0] and a later step's X[t] are one slot
    described = tuple((buf.dtype, buf.kind, buf in read) + ((buf.shape,) if offsets[buf] is None else (None,))
                      for buf in buffers)
    key = (text, described, stage.fixed, stage.sort is not None, stage.step is not None)
    return Form(stage, key, slots)


def group(stages, align_bytes: int, read: frozenset = frozenset()) -> list:
    """``[(template, [Form, ...])]``: ``stages`` grouped by key, in order of
    first appearance.  A stage with no twin is its own template (unchanged);
    the template of a group has, in each slot of linear indices, the fewest
    elements any member has past its pointer."""
    groups = {}
    for st in stages:
        f = form(st, align_bytes, read)
        groups.setdefault(f.key, []).append(f)
    out = []
    for members in groups.values():
        if len(members) == 1:
            only = members[0]
            out.append((only.stage, [Form(only.stage, only.key, tuple((b, 0) for b, _ in only.slots))]))
            continue
        sizes = {k: min(m.slots[k][0].size - m.slots[k][1] for m in members)
                 for k, described in enumerate(members[0].key[1]) if described[-1] is None}
        out.append((_canonical(members[0].stage, members[0].slots, sizes), members))
    return out


def slot_buffers(template: Stage) -> list:
    """A template's slot buffers, in slot order."""
    return stage_buffers(template)[0]


def instance(derived: Stage, member: Form, slots: list, temps: dict) -> Stage:
    """A stage ``derived`` from a template (by the schedule; ``slots``: the
    template's :func:`slot_buffers`) placed into ``member``: each slot buffer
    becomes the member's buffer, its offset added back, and each temporary the
    schedule made becomes ``temps[t]``."""
    buffer_map, shift = dict(temps), {}
    for canon, (buf, off) in zip(slots, member.slots):
        buffer_map[canon] = buf
        if off:
            shift[canon] = off
    body = _rewrite(derived.body, buffer_map, shift)
    step = derived.step
    if step is not None:
        step = replace(step, counter=buffer_map.get(step.counter, step.counter))
    return replace(derived, buffer=buffer_map.get(derived.buffer, derived.buffer), body=body, step=step)
