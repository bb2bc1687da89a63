"""TEMPORARY: the workarounds these modules use for compiler bugs that are
being fixed on main, all in this one place. Each flag switches its eval
module between the natural form (False) and the workaround (True); set a
flag to False, or delete it with its branch, once main has the fix.
Values and gradients are the same either way.
"""

#: Bug (a): ``te.gradient`` of a max reduced into a shape-(1,) tensor fails
#: in ``te.build`` ("loop IR uses variable ... outside its loop") when the
#: reduced extent is even and at least 65536 (GradBench's lse from
#: n = 80000 on). Workaround in ``lse.py``: the max is a 0-d tensor.
MAX_INTO_0D = True

#: Bug (b): ``te.build`` refuses gmm's packed index
#: ``l[k, c*(2*D-c-1)//2 + r-c-1]`` under ``c < r`` alone (IndexError: it
#: bounds the index by [0, D(D-1)-3] instead of [0, D(D-1)/2)). Workaround
#: in ``gmm.py``: the redundant condition ``packed < D(D-1)/2`` beside ``c < r``.
GUARD_PACKED_INDEX = True
