"""The UI server's CPU for opening a Run page, for one or more source trees side by side.

    .venv/bin/python bench/bench_page_script.py [--ranks 8] [--steps 10000] [--repeats 5] [--opens 10]
                                                [--tree PATH ...]

What the Streamlit server spends running the page's script when a person opens a finished run
and its Metrics section (the browser's own drawing is bench_render.py's). Uses bench_render.py's
seeded run (cached under /tmp). Each repetition starts one fresh process per tree, which runs
app/main.py in Streamlit's AppTest (the script as the server runs it, without a browser): it
opens the run's page (the Overview, with its curves) and then the Metrics section once to warm
up, then ``--opens`` times more, and prints the process's CPU per open. The trees take turns;
``--tree`` names another checkout to compare with (``git worktree add /tmp/before <commit>``).
Prints each repetition and the medians, and ends with its BENCHMARKS.md row
(bench/benchmarks_row.py).
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]


def child(tree: Path, home: Path, run_id: int, opens: int) -> None:
    """In a fresh process: CPU seconds per open of the Run page + Metrics, printed."""
    import logging  # noqa: PLC0415 - the child's own imports, after sys.path names the tree

    sys.path[:0] = [str(tree), str(tree / "tests" / "unit")]
    os.environ["RUNYARD_HOME"] = str(home)
    logging.disable(logging.WARNING)  # AppTest's "missing ScriptRunContext" lines
    from apptest import new_app  # noqa: PLC0415 - the tree's tests/unit/apptest.py

    def open_once() -> None:
        at = new_app().run()
        at.switch_page("views/run.py")
        at.query_params["run"] = str(run_id)
        at.run()
        at.segmented_control(key="section").set_value("Metrics").run()
        if at.exception:
            raise RuntimeError(f"the page raised: {at.exception}")

    def cpu() -> float:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return usage.ru_utime + usage.ru_stime

    open_once()
    started = cpu()
    for _ in range(opens):
        open_once()
    print((cpu() - started) / opens)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--steps", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--opens", type=int, default=10)
    parser.add_argument("--tree", type=Path, action="append", default=[], help="another runyard checkout")
    parser.add_argument("--child", nargs=4, metavar=("TREE", "HOME", "RUN_ID", "OPENS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        tree, home, run_id, opens = args.child
        child(Path(tree), Path(home), int(run_id), int(opens))
        return
    sys.path.insert(0, str(HERE))
    from bench.bench_render import seeded_home  # noqa: PLC0415 - needs HERE on sys.path
    from bench.benchmarks_row import load_average, print_row  # noqa: PLC0415 - needs HERE on sys.path

    load_at_start = load_average()

    home, run_id = seeded_home(args.ranks, args.steps, ("loss",))
    trees = [HERE, *(t.resolve() for t in args.tree)]
    results: dict[Path, list[float]] = {t: [] for t in trees}
    for rep in range(args.repeats):
        for tree in trees:
            out = subprocess.run([sys.executable, __file__, "--child", str(tree), str(home), str(run_id),
                                  str(args.opens)], capture_output=True, text=True, check=True, cwd=tree)
            results[tree].append(float(out.stdout.strip().splitlines()[-1]))
            print(f"{rep + 1}: {tree}: {results[tree][-1]:.3f} s of CPU per open", flush=True)
    print(f"Run page (Overview, then Metrics) of a finished {args.ranks} x {args.steps:,}-step run, "
          f"CPU per open, median of {args.repeats}:")
    for tree, values in results.items():
        print(f"  {tree}: {statistics.median(values):.3f} s (min {min(values):.3f}, max {max(values):.3f})")
    print(f"  load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    sides = []
    for tree, values in results.items():
        median = f"{statistics.median(values):.3f} s"
        sides.append(f"this checkout **{median}**" if tree == HERE else f"the tree at {tree} {median}")
    print_row("UI server CPU per Run page open", "the page script's CPU (AppTest, no browser) to open a finished "
              f"{args.ranks}-rank {args.steps:,}-step run and its Metrics section",
              "; ".join(sides) + f" an open; medians of {args.repeats}", load_at_start)


if __name__ == "__main__":
    main()
