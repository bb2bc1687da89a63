"""CP-SAT models written as CP-SAT's own model message.

OR-tools' ``cp_model`` module is a layer over ``cp_model_helper`` (the
solver's model message and its solve call) that also imports pandas: a
tenth of a second and more of a process's first build.  The integer
bounds here (``arith.bounds``, ``lowering.bounds_exact``) need only linear
constraints over bounded integer variables, with domains that are unions
of ranges and literals that enforce them, products, maxima and clauses:
this module writes those into the message directly and solves it with one
worker and a time limit.
"""
from __future__ import annotations

from dataclasses import dataclass

from .linear import LinearExpr

OPEN = 1 << 62          # beyond any bound the callers ask about: an open end of a range


@dataclass(frozen=True)
class Result:
    """A solve's outcome: ``status`` (``"optimal"``, ``"feasible"`` - out of
    time with a solution -, ``"infeasible"`` or ``"unknown"``), the
    objective's ``value`` and proven ``bound`` (in the sense asked), and
    the variables' ``values`` (``{index: value}``, empty unless a solution
    was found)."""

    status: str
    value: float
    bound: float
    values: dict


class Model:
    """One CP-SAT model message.  Its linear expressions are
    ``arith.linear.LinearExpr`` over the variables' indices; a literal is a
    Boolean variable's index, its negation ``-index - 1``."""

    def __init__(self):
        from ortools.sat.python import cp_model_helper
        self._cmh = cp_model_helper
        self.proto = cp_model_helper.CpModelProto()

    def _new(self, lo: int, hi: int, name: str) -> int:
        v = self.proto.variables.add()
        v.domain.extend([int(lo), int(hi)])
        v.name = name
        return len(self.proto.variables) - 1

    def int_var(self, lo: int, hi: int, name: str = "x") -> LinearExpr:
        return LinearExpr.var(self._new(lo, hi, name))

    def bool_var(self, name: str = "c") -> int:
        return self._new(0, 1, name)

    def _constraint(self, enforced):
        c = self.proto.constraints.add()
        c.enforcement_literal.extend(list(enforced))
        return c

    @staticmethod
    def _expression(proto, e: LinearExpr):
        proto.vars.extend(list(e.terms))
        proto.coeffs.extend(list(e.terms.values()))
        proto.offset = e.const

    def within(self, e: LinearExpr, *ranges, enforced=()):
        """``e`` in the union of the closed ``ranges`` (sorted, disjoint),
        where the literals ``enforced`` hold; with no range they cannot all hold."""
        if not ranges:
            self.clause([-x - 1 for x in enforced])
            return
        c = self._constraint(enforced).linear
        c.vars.extend(list(e.terms))
        c.coeffs.extend(list(e.terms.values()))
        c.domain.extend([x - e.const for lo, hi in ranges for x in (lo, hi)])

    def product(self, y: LinearExpr, a: LinearExpr, b: LinearExpr):
        """``y == a * b``."""
        c = self._constraint(()).int_prod
        self._expression(c.target, y)
        for x in (a, b):
            self._expression(c.exprs.add(), x)

    def maximum(self, y: LinearExpr, args):
        """``y == max(args)``."""
        c = self._constraint(()).lin_max
        self._expression(c.target, y)
        for x in args:
            self._expression(c.exprs.add(), x)

    def clause(self, literals, kind: str = "bool_or", enforced=()):
        """One of ``literals`` holds (``kind`` ``"bool_and"``: all of them),
        where ``enforced`` hold; an empty ``bool_or`` cannot hold."""
        getattr(self._constraint(enforced), kind).literals.extend(list(literals))

    def solve(self, objective: LinearExpr | None = None, maximize: bool = False, seconds: float = 10.0) -> Result:
        """Solve (optimising ``objective`` when given) with one worker."""
        cmh, sign = self._cmh, -1 if maximize else 1       # the message minimises
        self.proto.clear_objective()
        if objective is not None:
            self._expression(self.proto.objective, objective * sign)
        params = cmh.SatParameters()
        params.num_workers = 1
        params.max_time_in_seconds = seconds
        solver = cmh.SolveWrapper()
        solver.set_parameters(params)
        response = solver.solve(self.proto)
        status = response.status
        if status == cmh.CpSolverStatus.MODEL_INVALID:
            raise RuntimeError(f"CP-SAT rejected the model: {cmh.CpSatHelper.validate_model(self.proto)}")
        name = {cmh.CpSolverStatus.OPTIMAL: "optimal", cmh.CpSolverStatus.FEASIBLE: "feasible",
                cmh.CpSolverStatus.INFEASIBLE: "infeasible"}.get(status, "unknown")
        if objective is None and name == "feasible":
            name = "optimal"                               # nothing to optimise: a solution is the answer
        values = dict(enumerate(response.solution)) if name in ("optimal", "feasible") else {}
        return Result(name, sign * response.objective_value, sign * response.best_objective_bound, values)
