"""Which comparisons a declared stopping rule sends to its next look (``dapo sweep next-look``).

A spec's ``stopping: {looks: [n_1, …, n_K], …}`` is tested look by look (:mod:`analysis.sequential`):
at look k every comparison of the declared family uses the pairs of the spec's first n_k seeds. A
comparison the family decided at a look (its Holm-adjusted repeated p, or its TOST's, ≤ α) stops
there; the others go on to look k + 1, which needs the seeds n_k + 1 … n_{k+1} of their arms only.
After the last declared look nothing goes on: more seeds would be an unplanned look, which the
report marks.

:func:`plan_next_look` reads the family table (:func:`analysis.tables.family_table` with its
sequential columns) and returns the plan; it runs nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

__all__ = ["LookPlan", "plan_next_look"]


@dataclass(frozen=True)
class LookPlan:
    """What the next look of a declared stopping rule runs."""
    done: int                       # looks every family comparison has completed (0: not even look 1)
    next_look: int | None           # the 1-based look to run next; None: nothing to run
    seeds: tuple[int, ...]          # the seeds that look needs (the spec's first n_{next_look})
    arms: tuple[str, ...]           # the arms of the comparisons still undecided
    decided: tuple[str, ...]        # comparison labels, with the look that decided them
    undecided: tuple[str, ...]
    reason: str                     # one line: why this plan


def _n_looks(text) -> int:
    return len([x for x in str(text).split(",") if x.strip()]) if isinstance(text, str) else 0


def plan_next_look(family: pd.DataFrame | None, looks: tuple[int, ...], seeds: tuple[int, ...],
                   arm_order: tuple[str, ...] = ()) -> LookPlan:
    """The next look from the family table's ``looks_done``/``look`` columns.

    family: one row per declared comparison (columns comparison, off, on, looks_done, look), None
    before any run finished;
    looks: the declared pairs per look; seeds: the spec's seeds in declared order; arm_order: the
    spec's arm order (the plan lists arms in it)."""
    if family is None or len(family) == 0:
        return LookPlan(0, 1, tuple(seeds[: looks[0]]), (), (), (), "no comparison has a pair yet: look 1 runs")
    done = min(_n_looks(x) for x in family["looks_done"])
    decided = tuple(f"{r.comparison} (look {int(r.look)})" for r in family.itertuples() if int(r.look) > 0)
    open_rows = [r for r in family.itertuples() if int(r.look) == 0]
    undecided = tuple(r.comparison for r in open_rows)
    if done == 0:
        return LookPlan(0, 1, tuple(seeds[: looks[0]]), (), decided, undecided,
                        f"look 1 ({looks[0]} pairs) is not complete for every comparison: it runs first")
    if not open_rows:
        return LookPlan(done, None, (), (), decided, undecided,
                        f"every comparison was decided by look {done}: the rule stops, nothing more runs")
    if done >= len(looks):
        return LookPlan(done, None, (), (), decided, undecided,
                        f"the last declared look ({looks[-1]} pairs) is done; {len(open_rows)} comparison(s) "
                        f"stay undecided (more seeds would be an unplanned look)")
    wanted = {a for r in open_rows for a in (r.off, r.on)}
    order = [a for a in arm_order if a in wanted] + sorted(wanted - set(arm_order))
    n = looks[done]
    return LookPlan(done, done + 1, tuple(seeds[:n]), tuple(order), decided, undecided,
                    f"look {done} decided {len(decided)} of {len(family)} comparison(s); look {done + 1} "
                    f"({n} pairs) runs seeds {list(seeds[looks[done - 1]:n])} for the undecided one(s)")
