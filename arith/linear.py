"""Integer linear expressions, systems of linear constraints, and variable changes.

Variables are opaque: any hashable object whose ``str()`` names it (the tensor
layer passes its own index-variable nodes). ``Var`` provides fresh variables
for the solver's own unknowns (free and quotient variables).
"""

from __future__ import annotations

import math
from numbers import Integral
from types import MappingProxyType
from typing import Hashable, Iterable, Mapping

__all__ = ["Var", "LinearExpr", "LinearSystem", "Transform", "as_linear"]


class Var:
    """A fresh variable: every ``Var(name)`` is distinct, even with equal names."""

    __slots__ = ("name",)

    def __init__(self, name: str):
        if not isinstance(name, str):
            raise TypeError(f"Var name must be a str, got {type(name).__name__}")
        self.name = name

    def __str__(self) -> str:
        return self.name

    def __repr__(self) -> str:
        return f"Var({self.name!r})"


def _check_int(value, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, Integral):
        raise TypeError(f"{what} must be an integer, got {value!r} ({type(value).__name__})")
    return int(value)


class _ConstAccessor:
    """``LinearExpr.const(c)`` builds a constant; ``expr.const`` reads the constant term."""

    def __get__(self, obj, cls):
        if obj is None:
            return lambda value: cls({}, value)
        return obj._const


class LinearExpr:
    """``sum(coef[v] * v) + const`` with integer coefficients; immutable and hashable.

    Zero coefficients are dropped, so ``==`` is structural equality of the
    polynomial. Variables keep their first-appearance order (``.vars``), which
    makes printing deterministic.
    """

    __slots__ = ("_terms", "_const", "_hash")

    def __init__(self, terms: Mapping[Hashable, int] | None = None, const: int = 0):
        clean = {}
        for var, coef in (terms or {}).items():
            coef = _check_int(coef, f"coefficient of {var}")
            if coef:
                clean[var] = coef
        self._terms = clean
        self._const = _check_int(const, "constant")
        self._hash = None

    const = _ConstAccessor()

    @classmethod
    def var(cls, v: Hashable, coef: int = 1) -> "LinearExpr":
        return cls({v: coef}, 0)

    @classmethod
    def _raw(cls, terms: dict, const: int) -> "LinearExpr":
        # Trusted constructor: ``terms`` holds nonzero ints and is not shared.
        expr = object.__new__(cls)
        expr._terms = terms
        expr._const = const
        expr._hash = None
        return expr

    # -- read access ---------------------------------------------------------
    @property
    def terms(self) -> Mapping[Hashable, int]:
        return MappingProxyType(self._terms)

    @property
    def vars(self) -> tuple:
        return tuple(self._terms)

    @property
    def is_const(self) -> bool:
        return not self._terms

    def coeff(self, v: Hashable) -> int:
        return self._terms.get(v, 0)

    def gcd_of_coeffs(self) -> int:
        """gcd of the variable coefficients (0 for a constant expression)."""
        return math.gcd(*self._terms.values()) if self._terms else 0

    # -- arithmetic ----------------------------------------------------------
    def __add__(self, other) -> "LinearExpr":
        other = as_linear(other, "operand of +")
        terms = dict(self._terms)
        for var, coef in other._terms.items():
            total = terms.get(var, 0) + coef
            if total:
                terms[var] = total
            else:
                terms.pop(var, None)
        return LinearExpr._raw(terms, self._const + other._const)

    __radd__ = __add__

    def __neg__(self) -> "LinearExpr":
        return LinearExpr._raw({v: -c for v, c in self._terms.items()}, -self._const)

    def __sub__(self, other) -> "LinearExpr":
        return self + (-as_linear(other, "operand of -"))

    def __rsub__(self, other) -> "LinearExpr":
        return as_linear(other, "operand of -") + (-self)

    def __mul__(self, k) -> "LinearExpr":
        if isinstance(k, LinearExpr):
            if k.is_const:
                k = k._const
            elif self.is_const:
                return k * self._const
            else:
                raise TypeError(f"product of two non-constant expressions ({self}) * ({k}) is not linear")
        k = _check_int(k, "multiplier")
        if k == 0:
            return LinearExpr._raw({}, 0)
        return LinearExpr._raw({v: c * k for v, c in self._terms.items()}, self._const * k)

    __rmul__ = __mul__

    def exact_div(self, d: int) -> "LinearExpr":
        """``self / d``; ValueError unless ``d`` divides every coefficient and the constant."""
        d = _check_int(d, "divisor")
        if d == 0 or any(c % d for c in self._terms.values()) or self._const % d:
            raise ValueError(f"{d} does not divide ({self}) exactly")
        return LinearExpr._raw({v: c // d for v, c in self._terms.items()}, self._const // d)

    def substitute(self, mapping: Mapping[Hashable, "LinearExpr | int"]) -> "LinearExpr":
        """Replace each variable ``v`` in ``mapping`` by ``mapping[v]`` (simultaneously)."""
        result = LinearExpr._raw({}, self._const)
        kept = {}
        for var, coef in self._terms.items():
            if var in mapping:
                result = result + as_linear(mapping[var], f"substitution for {var}") * coef
            else:
                kept[var] = coef
        return LinearExpr._raw(kept, 0) + result

    def evaluate(self, env: Mapping[Hashable, int]) -> int:
        total = self._const
        for var, coef in self._terms.items():
            if var not in env:
                raise ValueError(f"no value for variable {var} when evaluating {self}")
            total += coef * env[var]
        return total

    # -- identity and printing -----------------------------------------------
    def __eq__(self, other) -> bool:
        if not isinstance(other, LinearExpr):
            return NotImplemented
        return self._const == other._const and self._terms == other._terms

    def __hash__(self) -> int:
        if self._hash is None:
            self._hash = hash((frozenset(self._terms.items()), self._const))
        return self._hash

    def __str__(self) -> str:
        parts = []
        for var, coef in self._terms.items():
            mag = abs(coef)
            text = str(var) if mag == 1 else f"{mag}*{var}"
            if not parts:
                parts.append(text if coef > 0 else f"-{text}")
            else:
                parts.append(f"{'+' if coef > 0 else '-'} {text}")
        if not parts:
            return str(self._const)
        if self._const:
            parts.append(f"{'+' if self._const > 0 else '-'} {abs(self._const)}")
        return " ".join(parts)

    def __repr__(self) -> str:
        return f"LinearExpr({self})"


def as_linear(value, what: str = "value") -> LinearExpr:
    """Coerce an int or a LinearExpr to a LinearExpr (TypeError otherwise)."""
    if isinstance(value, LinearExpr):
        return value
    return LinearExpr._raw({}, _check_int(value, what))


def _ordered_vars(exprs: Iterable[LinearExpr], seen: dict) -> None:
    for expr in exprs:
        for var in expr.vars:
            seen.setdefault(var, None)


class LinearSystem:
    """Integer points satisfying ranges, equalities (``e == 0``) and inequalities (``e >= 0``).

    ``variables`` is ordered (declared variables first, then any others in
    order of appearance); ``ranges`` maps some variables to an inclusive
    ``(lo, hi)``. Methods return new systems; the object never changes.
    """

    __slots__ = ("_variables", "_ranges", "_equalities", "_inequalities", "_hash")

    def __init__(self, variables: Iterable[Hashable] = (), ranges: Mapping | None = None,
                 equalities: Iterable = (), inequalities: Iterable = ()):
        self._equalities = tuple(as_linear(e, "equality") for e in equalities)
        self._inequalities = tuple(as_linear(e, "inequality") for e in inequalities)
        ranges = dict(ranges or {})
        for var, bounds in ranges.items():
            if not (isinstance(bounds, tuple) and len(bounds) == 2):
                raise TypeError(f"range of {var} must be a (lo, hi) tuple, got {bounds!r}")
            ranges[var] = (_check_int(bounds[0], f"lower bound of {var}"),
                           _check_int(bounds[1], f"upper bound of {var}"))
        self._ranges = ranges
        seen = dict.fromkeys(variables)
        seen.update(dict.fromkeys(ranges))
        _ordered_vars(self._equalities + self._inequalities, seen)
        self._variables = tuple(seen)
        self._hash = None

    @property
    def variables(self) -> tuple:
        return self._variables

    @property
    def ranges(self) -> Mapping[Hashable, tuple]:
        return MappingProxyType(self._ranges)

    @property
    def equalities(self) -> tuple:
        return self._equalities

    @property
    def inequalities(self) -> tuple:
        return self._inequalities

    def range_inequalities(self) -> list[LinearExpr]:
        """The ranges written as inequalities ``v - lo >= 0`` and ``hi - v >= 0``."""
        out = []
        for var, (lo, hi) in self._ranges.items():
            v = LinearExpr.var(var)
            out += [v - lo, hi - v]
        return out

    def all_inequalities(self) -> list[LinearExpr]:
        """Ranges, then equalities as pairs ``e >= 0, -e >= 0``, then inequalities."""
        out = self.range_inequalities()
        for e in self._equalities:
            out += [e, -e]
        return out + list(self._inequalities)

    def _replace(self, **changes) -> "LinearSystem":
        args = dict(variables=self._variables, ranges=self._ranges,
                    equalities=self._equalities, inequalities=self._inequalities)
        args.update(changes)
        return LinearSystem(**args)

    def with_range(self, var: Hashable, lo: int, hi: int) -> "LinearSystem":
        return self._replace(ranges={**self._ranges, var: (lo, hi)})

    def with_equality(self, expr) -> "LinearSystem":
        return self._replace(equalities=self._equalities + (as_linear(expr, "equality"),))

    def with_inequality(self, expr) -> "LinearSystem":
        return self._replace(inequalities=self._inequalities + (as_linear(expr, "inequality"),))

    def substitute(self, mapping: Mapping[Hashable, "LinearExpr | int"]) -> "LinearSystem":
        """Replace variables by expressions; a replaced variable's range becomes two inequalities."""
        ranges, range_ineqs = {}, []
        for var, (lo, hi) in self._ranges.items():
            if var in mapping:
                e = as_linear(mapping[var], f"substitution for {var}")
                range_ineqs += [e - lo, hi - e]
            else:
                ranges[var] = (lo, hi)
        seen = {v: None for v in self._variables if v not in mapping}
        _ordered_vars((as_linear(e) for e in mapping.values()), seen)
        return LinearSystem(
            variables=tuple(seen), ranges=ranges,
            equalities=[e.substitute(mapping) for e in self._equalities],
            inequalities=range_ineqs + [e.substitute(mapping) for e in self._inequalities])

    def contains(self, env: Mapping[Hashable, int]) -> bool:
        """Whether the integer point ``env`` satisfies every range and constraint."""
        for var, (lo, hi) in self._ranges.items():
            if var not in env:
                raise ValueError(f"no value for variable {var} in the point")
            if not lo <= env[var] <= hi:
                return False
        return (all(e.evaluate(env) == 0 for e in self._equalities)
                and all(e.evaluate(env) >= 0 for e in self._inequalities))

    def __eq__(self, other) -> bool:
        if not isinstance(other, LinearSystem):
            return NotImplemented
        return (self._variables == other._variables and self._ranges == other._ranges
                and self._equalities == other._equalities
                and self._inequalities == other._inequalities)

    def __hash__(self) -> int:
        if self._hash is None:
            self._hash = hash((self._variables, frozenset(self._ranges.items()),
                               self._equalities, self._inequalities))
        return self._hash

    def __str__(self) -> str:
        lines = []
        for var in self._variables:
            if var in self._ranges:
                lo, hi = self._ranges[var]
                lines.append(f"{lo} <= {var} <= {hi}")
        lines += [f"{e} == 0" for e in self._equalities]
        lines += [f"{e} >= 0" for e in self._inequalities]
        return "\n".join(lines) if lines else "(no constraints)"

    def __repr__(self) -> str:
        return f"LinearSystem(variables={self._variables!r}, {len(self._ranges)} ranges, " \
               f"{len(self._equalities)} equalities, {len(self._inequalities)} inequalities)"


class Transform:
    """A change of variables between an old and a new variable set.

    ``old_to_new[v]`` expresses each old variable over the new ones;
    ``new_to_old[w]`` expresses a new variable over the old ones where such
    an integer expression exists (it may be partial). Variables that are not
    old (resp. new) pass through unchanged, so parameters shared by both
    sides need no entry.
    """

    __slots__ = ("old_to_new", "new_to_old", "new_vars")

    def __init__(self, old_to_new: Mapping, new_to_old: Mapping | None = None,
                 new_vars: Iterable[Hashable] | None = None):
        self.old_to_new = MappingProxyType({v: as_linear(e, f"image of {v}")
                                            for v, e in old_to_new.items()})
        self.new_to_old = MappingProxyType({v: as_linear(e, f"preimage of {v}")
                                            for v, e in (new_to_old or {}).items()})
        self.new_vars = tuple(new_vars) if new_vars is not None else tuple(self.new_to_old)
        missing = [w for w in self.new_to_old if w not in self.new_vars]
        if missing:
            raise ValueError(f"new_to_old names {missing[0]}, which is not among new_vars")

    @property
    def old_vars(self) -> tuple:
        return tuple(self.old_to_new)

    def apply(self, expr) -> LinearExpr:
        """Rewrite an expression over the old variables into the new ones."""
        return as_linear(expr, "expression").substitute(self.old_to_new)

    def apply_inverse(self, expr) -> LinearExpr:
        """Rewrite an expression over the new variables into the old ones."""
        expr = as_linear(expr, "expression")
        for var in expr.vars:
            if var in self.new_vars and var not in self.new_to_old:
                raise ValueError(f"new variable {var} has no expression over the old variables")
        return expr.substitute(self.new_to_old)

    def compose(self, other: "Transform") -> "Transform":
        """``self`` then ``other``: old variables of self to new variables of other."""
        old_to_new = {v: other.apply(e) for v, e in self.old_to_new.items()}
        for v, e in other.old_to_new.items():
            old_to_new.setdefault(v, e)
        new_to_old = {}
        for w, e in other.new_to_old.items():
            if all(u not in self.new_vars or u in self.new_to_old for u in e.vars):
                new_to_old[w] = self.apply_inverse(e)
        kept_self = [w for w in self.new_vars if w not in other.old_to_new]
        for w in kept_self:
            if w in self.new_to_old:
                new_to_old.setdefault(w, self.new_to_old[w])
        new_vars = dict.fromkeys(list(other.new_vars) + kept_self)
        return Transform(old_to_new, new_to_old, tuple(new_vars))

    def __str__(self) -> str:
        lines = [f"{v} = {e}" for v, e in self.old_to_new.items()]
        lines += [f"{w} := {e}" for w, e in self.new_to_old.items()]
        return "\n".join(lines) if lines else "(identity)"

    def __repr__(self) -> str:
        return f"Transform({len(self.old_to_new)} old -> {len(self.new_vars)} new variables)"
