"""Power and expected pairs of a declared stopping rule against a fixed design (analysis.sequential).

    python -m bench.bench_sequential                       # looks 10, 16 (Pocock and O'Brien-Fleming) vs 16 fixed
    python -m bench.bench_sequential --looks 6,10,14 --n-sim 1000

Per effect size Δ/SD (normal paired differences): the probability the rule rejects H0 at some look
(two-sided, alpha 0.05, one comparison), the mean number of pairs it uses (stopping at the first look
that rejects), and the same for one test at the last look's pairs. Simulated, fixed seed; the size
under H0 (Δ = 0) is the first row. tests/test_sequential.py checks the size for a family.
"""

from __future__ import annotations

import argparse
import time

from analysis.sequential import design_power


def rows(looks: tuple[int, ...], spendings: tuple[str, ...], effects: tuple[float, ...], n_sim: int):
    for e in effects:
        fixed, _ = design_power((looks[-1],), "pocock", e, n_sim=n_sim)
        out = {"effect": e, "fixed": fixed}
        for s in spendings:
            out[s] = design_power(looks, s, e, n_sim=n_sim)
        yield out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--looks", default="10,16", help="pairs at each look (default 10,16)")
    ap.add_argument("--effects", default="0,0.5,1,2", help="Δ/SD values (default 0,0.5,1,2)")
    ap.add_argument("--spending", default="pocock,obrien_fleming")
    ap.add_argument("--n-sim", type=int, default=400, help="simulated experiments per cell (default 400)")
    a = ap.parse_args(argv)
    looks = tuple(int(x) for x in a.looks.split(","))
    spend = tuple(a.spending.split(","))
    t0 = time.time()
    print(f"## Stopping rule looks {list(looks)} vs one test at {looks[-1]} pairs "
          f"(alpha 0.05 two-sided, {a.n_sim} experiments per cell, seed 0)\n")
    head = ["Δ/SD", f"fixed {looks[-1]}: power"] + [f"{s}: power, expected pairs" for s in spend]
    print("| " + " | ".join(head) + " |\n|" + "---|" * len(head))
    for r in rows(looks, spend, tuple(float(x) for x in a.effects.split(",")), a.n_sim):
        cells = [f"{r['effect']:g}", f"{r['fixed']:.3f}"] + [f"{r[s][0]:.3f}, {r[s][1]:.1f}" for s in spend]
        print("| " + " | ".join(cells) + " |")
    print(f"\n({time.time() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
