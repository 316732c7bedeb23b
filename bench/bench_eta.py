"""How far to trust a run's ETA: recorded runs replayed, the predicted end against the true one.

    .venv/bin/python bench/bench_eta.py [--data bench/data/eta_runs.json ...] [--tune] [--queue [--repeats N]]

bench/eta_record.py records real runs through the real scheduler on this machine (the built-ins, a
script with evaluation pauses, a run that slows down when a second one starts, a run that retries)
into bench/data/eta_runs.json; this replays that file offline, so it takes a second and gives the
same numbers every time.

For every run and every progress point it logged (rank 0's (step, wall time)) whose step lies
within 5 points of 20, 50 or 80% of its steps, the estimator is given what the Runs list would
have read at that moment (the newest 60 points of the attempt then running) and predicts the
end; the truth is when the run logged its last step. Per share done: the median and p90 of the
error (|predicted - true| as a share of the time that was truly left), and the band's coverage
(how often the true end fell inside it; goal at least 80%). "before" is the estimator of main
at f42c02a, copied here (:func:`baseline`); "after" is db/vocabulary/eta.py's :func:`forecast`.
The retrying run is also judged halfway through its backoff (RETRYING), where "before"
projected from the failed attempt's pace as if no restart came, and "after" adds the restart.

``--queue`` then measures the queue's start estimates live (bench/bench_queue_eta.py: 3 runs queued
behind 2 running through a real scheduler, a few minutes a round; ``--repeats`` rounds).

``--tune`` prints the coverage and median band width of a grid of (BAND_BASE, BAND_PER_LEFT), to
choose the narrowest band that meets the goal at every share.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_queue_eta  # the queue's live half (--queue)
from benchmarks_row import print_row, verdict

from db.vocabulary import eta as eta_module
from db.vocabulary.eta import forecast, restart_ahead

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "bench" / "data" / "eta_runs.json"
SHARES = (0.2, 0.5, 0.8)
AROUND = 0.05  # moments within this share of steps of 20, 50 or 80% done
WINDOW = 60
GOAL = 0.8


# --- the estimator before issue 55 (db/vocabulary/cost.py at f42c02a), copied ---------------------


def baseline(points: Sequence[tuple[int, float]], max_steps: int) -> tuple[float, float, float] | None:
    """(seconds, low, high): the average pace of the newest 60 points; the band from the fastest
    and slowest of 4 parts of that window."""
    if len(points) < 2:
        return None
    pts = sorted(points)[-WINDOW:]
    (s0, t0), (s1, t1) = pts[0], pts[-1]
    if s1 <= s0 or t1 <= t0:
        return None
    pace = (s1 - s0) / (t1 - t0)
    left = max(0, max_steps - pts[-1][0])
    eta = left / pace
    rates = []
    size = max(1, (len(pts) - 1) // 4)
    for i in range(0, len(pts) - 1, size):
        (a, ta), (b, tb) = pts[i], pts[min(i + size, len(pts) - 1)]
        if b > a and tb > ta:
            rates.append((b - a) / (tb - ta))
    low = left / max(rates) if rates else eta
    high = left / min(rates) if rates else eta
    return eta, min(low, eta), max(high, eta)


# --- the replay -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Moment:
    """One prediction: which run, how far it was (``share``: 0.2, 0.5, 0.8, or None while
    retrying), when, and the truth."""

    recording: str
    share: float | None
    at: float
    true_end: float
    points: tuple[tuple[int, float], ...]
    max_steps: int
    status: str = "RUNNING"
    startups: tuple[tuple[int, float], ...] = ()
    retry_at: float | None = None
    resume_step: int | None = None
    first_step_at: float | None = None  # the next attempt's first step (a retrying moment): the restart's truth


def true_end(run: dict[str, Any]) -> float:
    """When the run logged its last step (its end, as the ETA means it), else when it ended."""
    last = run["attempts"][-1]["points"]
    return float(last[-1][1]) if last and last[-1][0] >= run["max_steps"] else float(run["ended_at"])


def moments(name: str, run: dict[str, Any]) -> list[Moment]:
    """Every moment of ``run`` to judge an estimator at."""
    end, total = true_end(run), run["max_steps"]
    out = []
    for a in run["attempts"]:
        pts = [(int(s), float(t)) for s, t in a["points"]]
        for i, (step, at) in enumerate(pts):
            for share in SHARES:
                if abs(step / total - share) <= AROUND and at < end:
                    out.append(Moment(name, share, at, end, tuple(pts[: i + 1]), total))
    for before, after in zip(run["attempts"], run["attempts"][1:], strict=False):
        if not before["cause"] or not before["points"]:
            continue
        # Halfway through the wait before the retry: the run is RETRYING, its newest attempt the failed one.
        at = (before["ended_at"] + after["started_at"]) / 2
        startups = tuple((a["number"], a["first_step_at"] - a["started_at"]) for a in run["attempts"]
                         if a["number"] <= before["number"] and a["first_step_at"] is not None)
        saved = [step for step, _, created in run["checkpoints"] if created <= at]
        out.append(Moment(name, None, at, end, tuple((int(s), float(t)) for s, t in before["points"]), total,
                          "RETRYING", startups, after["started_at"], max(saved) if saved else None,
                          after["first_step_at"]))
    return out


Predict = Callable[[Moment], tuple[float, float, float] | None]


def before(m: Moment) -> tuple[float, float, float] | None:
    return baseline(m.points, m.max_steps)


def after(m: Moment) -> tuple[float, float, float] | None:
    restart = restart_ahead(m.status, m.startups, m.retry_at, m.at, [], m.resume_step)
    f = forecast(m.points, m.max_steps, restart)
    return (f.seconds, f.low, f.high) if f is not None else None


def judge(ms: Sequence[Moment], predict: Predict) -> dict[str, Any]:
    """Median and p90 of the relative error, coverage and the band's median width (share of the
    time truly left), over ``ms``."""
    errors, inside, widths, missing = [], 0, [], 0
    for m in ms:
        p = predict(m)
        if p is None:
            missing += 1
            continue
        seconds, low, high = p
        left = m.true_end - m.at
        errors.append(abs(m.at + seconds - m.true_end) / left)
        inside += m.at + low <= m.true_end <= m.at + high
        widths.append((high - low) / left)
    n = len(errors)
    if not n:
        return {"n": 0, "none": missing}
    ordered = sorted(errors)
    return {"n": n, "none": missing, "median": statistics.median(errors),
            "p90": ordered[min(n - 1, round(0.9 * (n - 1)))], "coverage": inside / n,
            "width": statistics.median(widths)}


def groups(ms: list[Moment]) -> dict[str, list[Moment]]:
    out: dict[str, list[Moment]] = {f"{share:.0%} done": [m for m in ms if m.share == share] for share in SHARES}
    out["retrying"] = [m for m in ms if m.status == "RETRYING"]
    return out


def _cell(r: dict[str, Any]) -> str:
    if not r["n"]:
        return f"{'no ETA':>30}"
    return (f"{r['median']:>6.1%} {r['p90']:>6.1%} {r['coverage']:>6.0%} {r['width']:>6.0%}"
            + (f" ({r['none']} none)" if r["none"] else ""))


def table(ms: list[Moment]) -> list[str]:
    lines = [f"{'':<22}{'before: median   p90  cover  band':>34}   {'after: median   p90  cover  band':>34}"]
    for label, group in groups(ms).items():
        lines.append(f"{label + f' (n={len(group)})':<24}{_cell(judge(group, before)):>32}   "
                     f"{_cell(judge(group, after)):>32}")
    return lines


def tune(ms: list[Moment]) -> None:
    """The narrowest bands of a grid of (BAND_BASE, BAND_PER_LEFT, BAND_BELOW_MAX) that meet the goal
    at every share done: their coverage and median width per share."""
    saved = eta_module.BAND_BASE, eta_module.BAND_PER_LEFT, eta_module.BAND_BELOW_MAX
    found = []
    try:
        for base in (0.0, 0.05, 0.1, 0.15, 0.2):
            for per in (0.2, 0.4, 0.6, 0.8, 1.0, 1.2, 1.4):
                for below in (0.2, 0.25, 0.3, 0.35, 0.4):
                    eta_module.BAND_BASE, eta_module.BAND_PER_LEFT, eta_module.BAND_BELOW_MAX = base, per, below
                    cells = [judge(group, after) for label, group in groups(ms).items() if label != "retrying"]
                    if all(c["coverage"] >= GOAL for c in cells):
                        found.append((sum(c["width"] for c in cells), base, per, below, cells))
    finally:
        eta_module.BAND_BASE, eta_module.BAND_PER_LEFT, eta_module.BAND_BELOW_MAX = saved
    print(f"bands that meet {GOAL:.0%} at every share, narrowest first (BAND_BASE, BAND_PER_LEFT, BAND_BELOW_MAX):")
    for _, base, per, below, cells in sorted(found)[:8]:
        print(f"  {base:.2f} {per:.2f} {below:.2f}: coverage " + " ".join(f"{c['coverage']:.0%}" for c in cells)
              + "  width " + " ".join(f"{c['width']:.0%}" for c in cells))
    if not found:
        print("  none in the grid")


def replay(path: Path) -> tuple[dict[str, Any], list[Moment]]:
    """One recordings file and its moments, listed as they are read."""
    data = json.loads(path.read_text())
    ms: list[Moment] = []
    loads = ", ".join(f"{name} {r['load'][0]}-{r['load'][1]}" for name, r in data["recordings"].items() if "load" in r)
    print(f"{path.name}: recorded {data['machine']['recorded']} on {data['machine']['cpus']} CPUs"
          + (f" (1-minute load {loads})" if loads else "") + ":")
    for name, rec in data["recordings"].items():
        for run in rec["runs"]:
            found = moments(name, run)
            ms += found
            print(f"  {name}: {run['name']}, {run['max_steps']:,} steps, {len(run['attempts'])} attempt(s), "
                  f"{true_end(run) - run['attempts'][0]['started_at']:.0f} s; {len(found)} moments ({rec['what']})")
    print("\n".join(table(ms)))
    print(f"The wait to retry alone: {restart_words([m for m in ms if m.status == 'RETRYING'])}")
    print("Per recording (median error / coverage):")
    for name in data["recordings"]:
        mine = [m for m in ms if m.recording == name and m.share is not None]
        r, b = judge(mine, after), judge(mine, before)
        print(f"  {name:<12} before {b['median']:.1%} / {b['coverage']:.0%}   after {r['median']:.1%} / "
              f"{r['coverage']:.0%}")
    print()
    return data, ms


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, action="append",
                        help="a recordings file (repeatable; default: every bench/data/eta_runs*.json)")
    parser.add_argument("--tune", action="store_true")
    parser.add_argument("--queue", action="store_true",
                        help="also the queue's start estimates, live (bench/bench_queue_eta.py, minutes)")
    parser.add_argument("--repeats", type=int, default=2, help="with --queue: its rounds of five runs")
    args = parser.parse_args()
    paths = args.data or sorted(DATA.parent.glob("eta_runs*.json"))
    print("Error of the predicted end (share of the time truly left), band coverage and median width:\n")
    files = [replay(path) for path in paths]
    ms = [m for _, found in files for m in found]
    if len(files) > 1:
        print(f"All {len(files)} files:")
        print("\n".join(table(ms)))
    if args.tune:
        print()
        tune(ms)
    runs = sum(len(r["runs"]) for data, _ in files for r in data["recordings"].values())
    dates = sorted({data["machine"]["recorded"] for data, _ in files})
    print_row("ETA", "the predicted end of recorded runs (the built-ins, evaluation pauses, a second run starting, a "
              "retry) at 20, 50 and 80% done: median / p90 error as a share of the time left, and how often the "
              "true end fell inside the band, before (main at f42c02a) and after issue 55",
              summary(ms) + f"; {len(ms)} moments of {runs} runs recorded {', '.join(dates)}",
              max(load_of(data) for data, _ in files))
    if args.queue:
        print()
        return bench_queue_eta.main(["--repeats", str(args.repeats)])
    return 0


def summary(ms: list[Moment]) -> str:
    """The row's result: per share done, before -> after."""
    parts = []
    for label, group in groups(ms).items():
        b, a = judge(group, before), judge(group, after)
        if label == "retrying":
            was = f"{b['median']:.0%}" if b["n"] else "no ETA"
            parts.append(f"waiting to retry: error {was} -> **{a['median']:.0%}** (the restart included; "
                         f"{restart_words(group)})")
            continue
        met = verdict(a["coverage"] >= GOAL)
        parts.append(f"{label}: error {b['median']:.1%} / {b['p90']:.0%} -> {a['median']:.1%} / {a['p90']:.0%}, "
                     f"coverage {b['coverage']:.0%} -> **{a['coverage']:.0%}** ({met})")
    return "; ".join(parts)


def restart_words(ms: Sequence[Moment]) -> str:
    """The restart alone, predicted (backoff left + start-up) against measured (to the next first step)."""
    pairs = []
    for m in ms:
        restart = restart_ahead(m.status, m.startups, m.retry_at, m.at, [], m.resume_step)
        if restart is not None and m.first_step_at is not None:
            pairs.append(f"{restart.backoff_s + restart.startup_s:.1f} s against {m.first_step_at - m.at:.1f} s")
    return "restart predicted " + ", ".join(pairs) if pairs else "no restart measured"


def load_of(data: dict[str, Any]) -> float:
    """The 1-minute load when the recordings started (the row's load column; the replay itself is idle)."""
    loads = [r["load"][0] for r in data["recordings"].values() if "load" in r]
    return max(loads) if loads else os.getloadavg()[0]


if __name__ == "__main__":
    sys.exit(main())
