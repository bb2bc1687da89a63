"""Templates: stages that are one loop nest over other buffers (the steps of
an unrolled recurrence, ``share.py``) are scheduled once, as their template;
each instance gets the template's schedule over its own buffers and
temporaries."""
from __future__ import annotations

import re
from dataclasses import replace

from .. import share
from ..loop_ir import Stage
from .constructors import Temporaries


def instances(template: Stage, derived: list, made: list, members: list, temps: Temporaries) -> list:
    """The schedule ``derived`` of ``template`` (the temporaries it made:
    ``made``) placed into each member (a :class:`~lowering.share.Form`),
    each member with temporaries of its own (from ``temps``): a list of
    stages per member."""
    slots = share.slot_buffers(template)
    out = []
    for member in members:
        names = {canon.name: buf.name for canon, (buf, _) in zip(slots, member.slots)}
        names[template.name] = member.stage.name

        def named(name):                 # a stage or buffer name (the longest), then ".suffix" or "%m=rho"
            heads = [h for h in names if name == h or name.startswith((h + ".", h + "%"))]
            head = max(heads, key=len) if heads else re.split(r"[.%]", name, maxsplit=1)[0]
            return names.get(head, f"{member.stage.name}.{head}") + name[len(head):]

        own = {t: temps.new(named(t.name), t.shape, t.dtype) for t in made}
        out.append([replace(share.instance(d, member, slots, own), name=named(d.name)) for d in derived])
    return out
