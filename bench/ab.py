"""Paired A/B of the gateway's CPU per session: two revisions side by side, in the same seconds.

    python -m bench.ab REV_A REV_B [--sessions 50] [--rounds 4] [--seconds 25] [--python PATH]

Each revision (``git archive``, so committed code only; ``.`` is the working tree, a directory
a source tree as it is) runs as its own stack (gateway, scripted workers, own key prefix) on the
shared private Redis. Both gateways share the gateway core and serve ``--sessions`` real-time
duplex sessions each at the same time; the figure is B's CPU over A's in the same window, per
round, and their median and geometric mean. A and B take turns at starting first (the first
reads a few per cent higher, whichever code it runs), so use an even number of rounds. Run
apart, one after the other, two runs of the same code differed by 10-20 % on this shared
machine, more than most changes are worth; side by side ``REV_A == REV_B`` shows the spread
that is left. ``--python`` runs B's gateway under another interpreter (its dependencies
installed), everything else under this one.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bench import pinning
from bench.duplex_load import run_load
from bench.procstats import Sampler
from bench.stack import ROOT, Stack, install_cleanup, shared_redis


def checkout(rev: str, into: Path) -> Path:
    """The source tree of ``rev`` in ``into``; ``.`` is this working tree as it is, and a
    directory (a scratch copy with an experiment in it) is taken as it is too."""
    if rev == ".":
        return ROOT
    if Path(rev).is_dir():
        return Path(rev).resolve()
    into.mkdir(parents=True)
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", rev], check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def one_round(trees: list[Path], pythons: list[str], n: int, seconds: float) -> list[float]:
    """Gateway CPU % of a core per session, for each tree, over the same window."""
    stacks = [
        Stack(shared_redis(), python=python, root=t)
        for t, python in zip(trees, pythons, strict=True)
    ]
    try:
        for st in stacks:
            st.start_gateway()
            st.start_workers(n)
        pids = {str(i): st.gateway.pid for i, st in enumerate(stacks) if st.gateway}

        async def both() -> list[tuple[float, float]]:
            loads = await asyncio.gather(*(run_load(st.url, n, seconds, 3.0) for st in stacks))
            return [load.window for load in loads]

        with Sampler(pids) as sampler:
            windows = asyncio.run(both())
        a = max(w[0] for w in windows)
        b = min(w[1] for w in windows)
        return [sampler.window(str(i), a, b, digits=4)["cpu_pct"] / n for i in range(len(stacks))]
    finally:
        for st in stacks:
            st.stop()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("a", help="revision A (the reference)")
    p.add_argument("b", help="revision B")
    p.add_argument("--sessions", type=int, default=50, help="sessions on each gateway")
    p.add_argument("--rounds", type=int, default=4, help="even: A and B first in turn")
    p.add_argument("--seconds", type=float, default=25.0)
    p.add_argument("--python", default=sys.executable, help="interpreter of B's gateway")
    p.add_argument("--no-pin", action="store_true")
    args = p.parse_args(argv)
    install_cleanup()
    pinning.activate(pinning.plan(not args.no_pin))
    with tempfile.TemporaryDirectory(prefix="omniserve-ab-") as tmp:
        trees = [checkout(rev, Path(tmp) / name) for rev, name in ((args.a, "a"), (args.b, "b"))]
        print(f"A {args.a}, B {args.b} ({args.python}): {args.sessions} sessions each")
        size = (args.sessions, args.seconds)
        ratios = []
        pythons = [sys.executable, args.python]
        for r in range(args.rounds):
            # the stack started first reads a few per cent higher, whichever code it runs:
            # A and B take turns at being first, and an even number of rounds cancels it
            order = [0, 1] if r % 2 == 0 else [1, 0]
            got = one_round([trees[i] for i in order], [pythons[i] for i in order], *size)
            a, b = got[order.index(0)], got[order.index(1)]
            ratios.append(b / a)
            first = "AB"[order[0]]
            print(
                f"round {r}: A {a:.4f} B {b:.4f} % of a core per session, B/A {b / a:.3f}"
                f" ({first} first)"
            )
    mean = statistics.geometric_mean(ratios)
    listed = ", ".join(f"{x:.3f}" for x in ratios)
    print(f"B/A median {statistics.median(ratios):.3f}, geometric mean {mean:.3f} ({listed})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
