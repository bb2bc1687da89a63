"""Shift invariance of log-sum-exp: ``a + log(sum_c exp(b_c - a))`` equals
``log(sum_c exp(b_c))`` whatever ``a`` is, so its derivative does not reach
``a`` through the shift.

Written with the max trick (``a = max_c b_c``, as every stable softmax,
cross-entropy or mixture likelihood is), reverse mode sends ``a`` the
adjoint ``g`` through the sum and ``-g / S * S`` through the exponentials
(``S`` the sum): zero in exact arithmetic, a rounding residue in floating
point, whose route on to the inputs (a max's derivative) costs a pass of
its own finding each row's argmax.  Both routes are cut where a formula has
that shape: in the tensor ``T`` reading the sum ``R``, the edge from ``a +
log(R[idx])`` to ``a``; in ``R``'s reduction, the edge from ``b_c - a`` to
``a``.  For every adjoint ``g`` of the sum node the two carry ``g`` and
``-g`` (``R``'s adjoint is ``g / S``, its reduction gives ``a`` that times
``-S``), so the cut is exact when:

* ``R`` is a sum of ``exp(b_c - a_R)`` and no other tensor reads it;
* in ``T``, ``R`` is read only as the argument of that ``log``, and the
  ``log`` is used only in that sum;
* ``a_R`` at ``R[idx]`` is ``a``, the same expression (so it does not
  vary along the sum: ``a`` is outside it).

The normalised exponential (a softmax) is shift invariant too:
``exp(b_j - a) / sum_c exp(b_c - a)`` does not depend on ``a``.  Reverse
mode sends ``a`` ``-E_j (g_j / Z + g_Z)`` from each exponential ``E_j``
(``g_j`` its ratio's adjoint, ``Z`` the sum) with ``g_Z = -sum_j g_j E_j /
Z^2``: again zero up to rounding, and again a max's argmax pass.  In a
tensor ``T`` reading ``E[idx] / Z[idx']`` (or ``exp(b - a) / Z[idx']``)
with ``Z`` a sum of ``E`` (of ``exp(b_c - a_Z)``), the edges from each ``b
- a`` to ``a`` are cut when:

* ``Z`` is read by ``T`` alone, once, as that denominator; ``E`` (a tensor
  ``exp(b - a)``) by ``Z`` and ``T`` alone, in ``T`` once, as that
  numerator (an inline ``exp(b - a)`` numerator used only there);
* the shift at the numerator's index is the shift at ``Z[idx']``, the same
  expression (``a`` does not vary along the sum).

The cancellation holds whichever elements of ``E`` the ratios read and the
sum adds (a causal mask, ``cond ? E[i, c] : 0``): ``g_Z`` gathers exactly
the ratios' terms, and the exponentials the sum adds make ``Z``.  So it
does where the exponentials are masked themselves, ``cond ? exp(b - a) :
0`` (a tensor or inline; in a log-sum-exp's sum as well): a masked element
is a constant zero that ``a`` does not reach.  It holds
too when the shifted exponent is scaled, ``exp((b - a) / t)`` or ``exp(c (b
- a))`` (a temperature, attention's ``1/√d``), the numerator's factors
those of the sum at ``idx'``: ``a``'s route through ``b - a`` carries the
same factor both ways; and when the ratio is written ``E[idx] · (c /
Z[idx'])`` (inline, or a tensor ``R = c / Z`` that ``T`` alone reads), ``c``
a constant: ``Z``'s adjoint is the ratio's times ``-c / Z^2``, the same
``-sum_j g_j E_j / Z^2`` up to the factor ``c`` both routes share.

``b_c`` and ``a`` may depend on anything, ``a`` itself included: only the
cancelling edges are cut, every other route is differentiated as written.
"""
from __future__ import annotations

from functools import cache, partial

from .expr import BinOp, Load, MatchSum, Reduce, ScanState, Select, Unary, is_const
from .lift import lifted
from .visit import children, substitute, topo_order


def _element(t):
    """The reduction-free body of ``t``'s normal form (a top-level reduction's
    body), the nodes reverse mode visits (``gradient.tensor_terms``); None for
    a sum over matches or a scan's state, differentiated from other nodes."""
    body = lifted(t).body
    if isinstance(body, (MatchSum, ScanState)):
        return None
    return body.body if isinstance(body, Reduce) else body


def _parents(root) -> dict:
    """``{node: [parent, ...]}`` over the DAG ``root`` (a parent once per edge)."""
    out = {}
    for node in topo_order([root]):
        for c in children(node):
            out.setdefault(c, []).append(node)
    return out


def _exp_shift(node, parents=None):
    """``(d, factors)`` when ``node`` is ``exp(f)`` with ``f`` the node ``d =
    b - a`` times or divided by ``factors`` (``((op, side, x), ...)``: a
    temperature, ``exp((b - a) / t)``), every node from ``f`` down to ``d``
    used once in the body ``parents`` maps, so that cutting ``d``'s edge to
    ``a`` cuts no other route; None otherwise.  Without ``parents`` ``f``
    must be ``b - a`` itself."""
    if not (isinstance(node, Unary) and node.op == "exp"):
        return None
    if parents is not None:
        return _scaled_shift(node.a, node, parents)
    return (node.a, ()) if isinstance(node.a, BinOp) and node.a.op == "sub" else None


def _scaled_shift(f, parent, parents):
    """``(d, factors)`` of :func:`_exp_shift` for ``f``, a child of ``parent``."""
    if parents.get(f) != [parent] or not isinstance(f, BinOp):
        return None
    if f.op == "sub":
        return f, ()
    for inner, side in ((f.a, 1), (f.b, 0))[:{"mul": 2, "div": 1}.get(f.op, 0)]:     # (b - a) / t, not t / (b - a)
        found = _scaled_shift(inner, f, parents)
        if found is not None:
            return found[0], found[1] + ((f.op, side, (f.a, f.b)[side]),)
    return None


def _shift_at(d, t, indices):
    """The shift ``a`` of ``d`` (``b - a`` in ``t``'s body) at ``t[indices]``."""
    return substitute(d.b, dict(zip(lifted(t).axes, indices)))


def _key(found, axes, indices) -> tuple:
    """The shift and the factors of ``_exp_shift``'s ``found`` with ``axes``
    replaced by ``indices``: two exponentials with equal keys shift by the
    same ``a`` and scale it alike."""
    d, factors = found
    at = dict(zip(axes, indices))
    return (substitute(d.b, at),) + tuple((op, side, substitute(x, at)) for op, side, x in factors)


def _logsumexp(t, body, parents, users):
    """``(tensor, edge)`` cuts for each ``a + log(R[idx])`` in ``t``'s
    ``body``: ``a`` and the log terms of one sum of terms with one sign
    (``x - a - log(R)``, a log-softmax, as well); and for each ``s -
    log(sum_c exp(s_c))`` of shifted logits ``s = b - a`` (a tensor, as
    PyTorch and JAX write a log-softmax), whose shift cancels the same way."""
    for node in topo_order([body]):
        if not (isinstance(node, BinOp) and node.op in ("add", "sub")):
            continue
        terms = _signed_terms(node, parents())
        for term, sign, parent, _ in terms:
            found = _log_of_sum(t, term, parent, parents, users)
            rbody = found and lifted(found[0]).body
            if not (isinstance(rbody, Reduce) and rbody.op == "sum"):
                continue
            r, to_t = found[0], dict(zip(lifted(found[0]).axes, found[1]))
            d = _exp_shift(_summand(rbody.body))
            if d is not None:                                   # a + log(sum exp(b - a))
                shift = substitute(d[0].b, to_t)
                edge = next(((p, k) for x, s, p, k in terms if x is shift and s == sign), None)
                if edge is not None:
                    yield t, edge
                    yield r, (d[0], 1)
                continue
            e = rbody.body
            if not (isinstance(e, Unary) and e.op == "exp" and isinstance(e.a, Load)):
                continue
            logits = e.a.tensor                                 # s - log(sum exp(s)), s = b - a
            d = None if logits.is_placeholder or set(users.get(logits, ())) != {t, r} else lifted(logits).body
            if not (isinstance(d, BinOp) and d.op == "sub"):
                continue
            reads = _reads(parents(), logits)                  # once, a term of the opposite sign
            once = len(reads) == 1 and len(parents()[reads[0]]) == 1
            if once and (reads[0], -sign) in {(x, s) for x, s, _, _ in terms} \
                    and _shift_at(d, logits, reads[0].indices) is substitute(_shift_at(d, logits, e.a.indices), to_t):
                yield logits, (d, 1)


def _log_of_sum(t, term, parent, parents, users):
    """``(R, indices)`` when ``term`` (``parent``'s child) is ``log(R[idx])``,
    or reads a tensor ``L = log(R[...])`` that only ``t`` reads, once;
    ``indices`` ``R``'s in ``t``'s axes, ``R`` read by nothing else, once."""
    if parents().get(term) != [parent] or not isinstance(term, (Unary, Load)):
        return None
    log, holder, at = term, t, {}
    if isinstance(term, Load):
        owner = term.tensor
        if owner.is_placeholder or set(users.get(owner, ())) != {t} or _reads(parents(), owner) != [term]:
            return None
        log, holder, at = lifted(owner).body, owner, dict(zip(lifted(owner).axes, term.indices))
    if not (isinstance(log, Unary) and log.op == "log" and isinstance(log.a, Load)):
        return None
    r = log.a.tensor
    if r.is_placeholder or set(users.get(r, ())) != {holder}:
        return None
    if holder is t and (_reads(parents(), r) != [log.a] or parents()[log.a] != [log]):
        return None
    return r, tuple(substitute(i, at) for i in log.a.indices)


def _signed_terms(node, parents: dict) -> list:
    """``(term, sign, parent, k)`` for each term of the sum or difference
    ``node``, through the sums and differences below it used there alone
    (``parent``'s child ``k`` is the term)."""
    out, stack = [], [(node, 1)]
    while stack:
        n, sign = stack.pop()
        for k, c in enumerate(children(n)):
            s = -sign if n.op == "sub" and k == 1 else sign
            if isinstance(c, BinOp) and c.op in ("add", "sub") and parents.get(c) == [n]:
                stack.append((c, s))
            else:
                out.append((c, s, n, k))
    return out


def _normalised(t, body, parents, users):
    """``(tensor, edge)`` cuts for each ratio of an exponential to its sum
    in ``t``'s ``body`` (``_ratios``)."""
    for num, z, at_z in _ratios(t, body, parents, users):
        zbody = lifted(z).body
        if not (isinstance(zbody, Reduce) and zbody.op == "sum"):
            continue
        term = _summand(zbody.body)
        z_axes = lifted(z).axes
        if isinstance(num, Load) and isinstance(term, Load) and num.tensor is term.tensor:
            e = num.tensor
            if e.is_placeholder or set(users.get(e, ())) != {t, z} or _reads(parents(), e) != [num]:
                continue
            ebody, e_axes, to_t = lifted(e).body, lifted(e).axes, dict(zip(z_axes, at_z))
            summed = tuple(substitute(i, to_t) for i in term.indices)       # the sum's index in t's axes
            found = _exp_shift(_summand(ebody), _parents(ebody))
            if found is not None and _key(found, e_axes, num.indices) == _key(found, e_axes, summed):
                yield e, (found[0], 1)
            logits = _exp_of_logits(ebody, users, {e})
            if logits is not None and logits[2](e_axes, num.indices) is logits[2](e_axes, summed):
                yield logits[0], (logits[1], 1)
        else:
            dn, dz = _exp_shift(_summand(num), parents()), _exp_shift(term, _parents(zbody))
            if dn is not None and dz is not None and _key(dn, (), ()) == _key(dz, z_axes, at_z):
                yield t, (dn[0], 1)
                yield z, (dz[0], 1)
            ln, lz = _exp_of_logits(num, users, {t, z}), _exp_of_logits(term, users, {t, z})
            if ln is not None and lz is not None and ln[0] is lz[0] and _reads(parents(), ln[0]) == [num.a] \
                    and parents()[num.a] == [num] and _reads(_parents(zbody), ln[0]) == [term.a] \
                    and ln[2]((), ()) is lz[2](z_axes, at_z):
                yield ln[0], (ln[1], 1)


def _exp_of_logits(node, users, readers):
    """``(s, d, shift_at)`` when ``node`` is ``exp(s[idx])`` with ``s`` a
    tensor ``b - a`` (shifted logits, the node ``d``) that ``readers`` alone
    read; ``shift_at(axes, indices)``: the shift ``a`` at ``idx`` with
    ``axes`` replaced by ``indices``.  None otherwise."""
    if not (isinstance(node, Unary) and node.op == "exp" and isinstance(node.a, Load)):
        return None
    s = node.a.tensor
    d = None if s.is_placeholder or set(users.get(s, ())) != readers else lifted(s).body
    if not (isinstance(d, BinOp) and d.op == "sub"):
        return None

    def shift_at(axes, indices):
        at = dict(zip(axes, indices))
        return _shift_at(d, s, tuple(substitute(i, at) for i in node.a.indices))
    return s, d, shift_at


def _ratios(t, body, parents, users):
    """``(numerator, Z, indices)`` for each ratio ``x / Z[idx]``, ``x *
    (c / Z[idx])`` or ``x * R[idx']`` (``R`` a tensor ``c / Z[...]``, ``c`` a
    constant) of ``t``'s ``body``, ``indices`` ``Z``'s in ``t``'s axes:
    ``Z`` (and ``R``) read by nothing else, once; the numerator used there
    alone."""
    for node in topo_order([body]):
        if not isinstance(node, BinOp):
            continue
        if node.op == "div":
            pairs = ((node.a, node.b),)
        elif node.op == "mul":
            pairs = ((node.a, node.b), (node.b, node.a))
        else:
            continue
        for num, den in pairs:
            found = _reciprocal(node, den, t, parents, users)
            if found is not None and parents().get(num) == [node]:
                yield (num,) + found
                break


def _reciprocal(node, den, t, parents, users):
    """``(Z, indices)`` when ``den`` (a child of ``node``) contributes
    ``1 / Z[indices]`` up to a constant factor (``node`` a division by
    ``Z[...]``, or a product with ``c / Z[...]`` inline or as a tensor
    ``R``); None otherwise."""
    def alone(load, parent, reader, body_parents):
        z = load.tensor
        return not z.is_placeholder and set(users.get(z, ())) == {reader} \
            and _reads(body_parents, z) == [load] and body_parents.get(load) == [parent]

    if node.op == "div":
        return (den.tensor, den.indices) if isinstance(den, Load) and alone(den, node, t, parents()) else None
    if isinstance(den, BinOp) and den.op == "div" and is_const(den.a) and isinstance(den.b, Load):
        ok = parents().get(den) == [node] and alone(den.b, den, t, parents())
        return (den.b.tensor, den.b.indices) if ok else None
    if isinstance(den, Load) and alone(den, node, t, parents()):
        r = den.tensor
        rbody = lifted(r).body
        if isinstance(rbody, BinOp) and rbody.op == "div" and is_const(rbody.a) and isinstance(rbody.b, Load) \
                and alone(rbody.b, rbody, r, _parents(rbody)):
            at = dict(zip(lifted(r).axes, den.indices))
            return rbody.b.tensor, tuple(substitute(i, at) for i in rbody.b.indices)
    return None


def _summand(term):
    """The term a sum adds where it adds anything: ``x`` of ``cond ? x : 0``
    (a masked sum, over a subset of the axis), else ``term``."""
    return term.a if isinstance(term, Select) and is_const(term.b, 0) else term


def _reads(parents: dict, r) -> list:
    """The loads of tensor ``r`` among the nodes of ``parents``."""
    return [x for x in parents if isinstance(x, Load) and x.tensor is r]


def cut_edges(tensors, users) -> dict:
    """``{tensor: {(node, k), ...}}``: the edges (``node``'s child ``k``) of
    each tensor's element body along which reverse mode sends nothing, for
    the log-sum-exps and normalised exponentials of ``tensors`` with the
    shapes above; ``users`` maps a tensor to the tensors reading it."""
    cuts = {}
    for t in tensors:
        body = None if t.is_placeholder else _element(t)
        if body is None:
            continue
        parents = cache(partial(_parents, body))      # walked only when a pattern asks
        for pattern in (_logsumexp, _normalised):
            for tensor, edge in pattern(t, body, parents, users):
                cuts.setdefault(tensor, set()).add(edge)
    return cuts
