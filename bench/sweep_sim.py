"""ASHA against random search on a toy problem, through runyard's own decision code, on a simulated clock.

Imported by bench_sweep.py (part 2). No process is started: each trial is a deterministic toy
learning curve, and the sweep is driven pass by pass, every ``SWEEP_EVERY_S`` simulated seconds as
the scheduler's ``sweeps`` job does, by the same functions the job applies:

- the trials' values: ``orchestrator.sweeps.searchers.suggest`` (the ``random`` searcher, seeded
  by the sweep's seed and the trial's number);
- the rungs: ``asha.base_rungs`` of examples/sweep.toml (steps 10, 30 and 90 of 270);
- at each pass, a trial that passed rungs is judged at the newest (``asha.judge``: the values
  recorded at that rung so far, its own included), and stopped early when below the cut;
- what the sweep does next: ``reconcile.decide`` over a ``reconcile.Plan`` (the budget by
  ``budget.limit_reached``, promotion by ``reconcile.promotable``, then a new trial).

The clock: a launch (a new trial, or a promotion's resume) takes ``startup_s`` to its first step,
then a step takes ``step_s``; a trial stopped early finishes its step and keeps its checkpoint
there (a promotion continues from it, no step trained twice); GPU time is every attempt's time,
its start-up included, times its devices (the base config's ``nproc_per_node``), as runyard's
budget counts it. Two toy curves (:func:`curve`), the same loss floors: ``ordered``, where every
trial falls at the same pace (what ASHA assumes: a trial behind early stays behind), and
``crossing``, where a larger learning rate falls faster and ends worse (what it gets wrong);
:func:`rank_agreement` says how well each toy's order at the rungs foretells its order at the end.
"""

from __future__ import annotations

import hashlib
import math
import random
import statistics
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from db.vocabulary.config import RunConfig, parse_config, parse_toml
from db.vocabulary.config.sweep import SweepConfig
from orchestrator.sweeps import asha
from orchestrator.sweeps.budget import limit_reached
from orchestrator.sweeps.reconcile import SWEEP_EVERY_S, Next, Plan, decide, promotable
from orchestrator.sweeps.rungs import Sweeping
from orchestrator.sweeps.searchers import params_key, suggest

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "sweep.toml"


def example(seed: int, early_stop: bool, gpu_hours: float = 0.0, max_trials: int | None = None
            ) -> tuple[RunConfig, SweepConfig]:
    """examples/sweep.toml as the base and section of one side: the random searcher with ``seed``,
    ASHA or no early stop, and a GPU-hours budget (0: none)."""
    data = parse_toml(EXAMPLE.read_text())
    section = data["sweep"]
    section.update(searcher="random", seed=seed, budget={"gpu_hours": gpu_hours, "max_failed": 0})
    if max_trials is not None:
        section["max_trials"] = max_trials
    if not early_stop:
        section.pop("early_stop", None)
    base = parse_config(data)
    assert base.sweep is not None
    return base, base.sweep


TOYS = ("ordered", "crossing")


def curve(params: dict[str, Any], step: int, noise_seed: int, toy: str = "ordered") -> float:
    """The toy objective (eval_loss) of a trial with ``params`` after ``step`` steps: from 2.3
    down towards a floor set by the learning rate (best near 5e-3), the width and the weight decay,
    with a deterministic 1% noise per (seed, trial, step). ``ordered``: every trial falls at the
    same pace, so the curves keep their order but for the noise; ``crossing``: the larger the rate
    the faster it falls (9 steps to fall by 1/e at 0.1, 300 at 1e-4), so a large rate leads early
    and loses late, ASHA's known weakness."""
    x = math.log10(params["train.lr"])
    floor = (0.08 + 0.25 * (x + 2.3) ** 2 + 0.06 * math.sqrt(32 / params["workload.hidden"])
             + 2.0 * (params["train.weight_decay"] - 0.02) ** 2)
    tau = 30.0 * 10 ** (-(x + 2.0) * 0.5) if toy == "crossing" else 40.0
    clean = floor + (2.3 - floor) * math.exp(-step / tau)
    digest = hashlib.sha256(f"{noise_seed}:{params_key(params)}:{step}".encode()).digest()
    return clean * (1 + 0.01 * (random.Random(digest).random() * 2 - 1))


def rank_agreement(toy: str, steps: list[int], final: int, n: int = 300) -> list[float]:
    """How well the toy's order at each of ``steps`` foretells its order at ``final``: Spearman's
    rank correlation over ``n`` random configurations of the example's space."""
    section = example(0, early_stop=True)[1]
    configs = [suggest(section, 0, number, []) or {} for number in range(n)]

    def ranks(step: int) -> list[float]:
        values = [curve(c, step, 0, toy) for c in configs]
        order = sorted(range(n), key=values.__getitem__)
        out = [0.0] * n
        for rank, i in enumerate(order):
            out[i] = float(rank)
        return out

    last = ranks(final)
    return [statistics.correlation(ranks(step), last) for step in steps]


@dataclass
class Trial:
    """One trial in the simulation, shaped where runyard's functions read it like a row of
    db/sweeps/queries.py's ``trials_of`` (``status``, ``rung``, ``rungs``, ``prune``)."""

    number: int
    params: dict[str, Any]
    status: str = "RUNNING"  # RUNNING (training), PRUNED or SUCCEEDED
    rung: int | None = None
    rungs: dict[int, dict[str, float]] = field(default_factory=dict)
    prune: dict[str, Any] | None = None
    step: int = 0  # steps done when its current attempt started, then when it stopped
    launched: float = 0.0  # the current attempt's launch
    attempts: list[tuple[float, float]] = field(default_factory=list)  # ended attempts: (launch, end)
    objective: float | None = None
    finished_at_gpu_s: float | None = None

    def __getitem__(self, key: str) -> Any:  # reconcile.promotable reads a trial as a dict
        return getattr(self, key)


@dataclass
class Outcome:
    """One side's result: every finished trial's value with the GPU time spent when it finished."""

    finished: list[tuple[float, float]]  # (GPU seconds spent then, objective), in order of finishing
    gpu_s: float
    trials: int
    promotions: int
    ended: str

    @property
    def best(self) -> float:
        return min((v for _, v in self.finished), default=math.inf)

    def gpu_s_to_reach(self, target: float) -> float | None:
        """GPU seconds spent when the best finished trial first reached ``target`` or better."""
        return next((at for at, v in self.finished if v <= target), None)


@dataclass
class Clock:
    """What a launch and a step cost (simulated seconds), and each trial's devices."""

    step_s: float = 0.5
    startup_s: float = 5.0
    devices: int = 2


def simulate(base: RunConfig, section: SweepConfig, clock: Clock, noise_seed: int, toy: str) -> Outcome:
    """One sweep, pass by pass (module docstring), until it is FINISHED or STOPPED by its budget."""
    max_steps, rungs = asha.trial_steps(base), asha.base_rungs(base, section.early_stop)
    early = section.early_stop
    trials: list[Trial] = []
    sweeping = Sweeping(None, None, section, rungs, trials)  # type: ignore[arg-type]  # no database here
    now, promotions = 0.0, 0

    def steps_at(t: Trial, at: float) -> int:
        done = max(0, math.floor((at - t.launched - clock.startup_s) / clock.step_s))
        return min(max_steps, t.step + done)

    def gpu_s(at: float) -> float:  # spent up to ``at`` (at most now): every attempt's time so far, x devices
        ended = sum(max(0.0, min(end, at) - start) for t in trials for start, end in t.attempts)
        running = sum(max(0.0, at - t.launched) for t in trials if t.status == "RUNNING")
        return (ended + running) * clock.devices

    def stop(t: Trial, at: float, status: str) -> None:
        t.attempts.append((t.launched, at))
        t.status, t.step = status, steps_at(t, at)

    while True:
        # The trials' progress since the last pass: the rungs each passed, then its end (at the
        # moment it reached its last step), or, still training, its judgement at the newest rung.
        ends = []
        for t in [t for t in trials if t.status == "RUNNING"]:
            reached = steps_at(t, now)
            passed = [k for k, step in enumerate(rungs) if step <= reached and (t.rung is None or k > t.rung)]
            for k in passed:
                t.rungs[k] = {"step": rungs[k], "value": curve(t.params, rungs[k], noise_seed, toy)}
                t.rung = k
            if reached >= max_steps:
                end = t.launched + clock.startup_s + (max_steps - t.step) * clock.step_s
                stop(t, end, "SUCCEEDED")
                t.objective = curve(t.params, max_steps, noise_seed, toy)
                ends.append((t, end))
            elif passed:
                assert early is not None and t.rung is not None
                value = t.rungs[t.rung]["value"]
                if asha.judge(value, sweeping.values_at(t.rung), early.reduction, section.goal).verdict.prunes:
                    stop(t, now, "PRUNED")
                    t.prune = {"rung": t.rung}
        for t, end in ends:
            t.finished_at_gpu_s = gpu_s(end)
        spent = {"gpu_hours": gpu_s(now) / 3600, "usd": 0.0, "wall_hours": now / 3600}
        plan = Plan(status="RUNNING", active=sum(t.status == "RUNNING" for t in trials), held=0,
                    started=len(trials), max_trials=section.max_trials, max_concurrent=section.max_concurrent,
                    breaker=None, budget=limit_reached(spent, section.budget), promotable=promotable(sweeping))
        while True:
            found = decide(plan)
            if found in (Next.BREAKER, Next.BUDGET):  # stopped: the trials training stop now
                for t in trials:
                    if t.status == "RUNNING":
                        stop(t, now, "PRUNED")
                return _outcome(trials, gpu_s(now), promotions, "stopped by its budget")
            if found is Next.FINISH:
                return _outcome(trials, gpu_s(now), promotions, "finished")
            if found is Next.PROMOTE:
                t = trials[plan.promotable[0]]
                t.status, t.launched = "RUNNING", now
                promotions += 1
                plan = replace(plan, promotable=plan.promotable[1:], active=plan.active + 1)
                continue
            if found is Next.START:
                params = suggest(section, section.seed, plan.started, [], {params_key(t.params) for t in trials})
                if params is None:
                    plan = replace(plan, exhausted=True)
                    continue
                trials.append(Trial(plan.started, params, launched=now))
                plan = replace(plan, started=plan.started + 1, active=plan.active + 1)
                continue
            break  # FULL or WAIT: the next pass
        now += SWEEP_EVERY_S


def _outcome(trials: list[Trial], gpu_s: float, promotions: int, ended: str) -> Outcome:
    done = sorted((t.finished_at_gpu_s, t.objective) for t in trials
                  if t.objective is not None and t.finished_at_gpu_s is not None)
    return Outcome(done, gpu_s, len(trials), promotions, ended)


def compare(seed: int, clock: Clock, toy: str) -> dict[str, Any]:
    """One seed: the 27-trial ASHA sweep of examples/sweep.toml (random searcher), then random
    search without early stopping given the GPU time ASHA spent; the best each reached and the GPU
    time each needed to reach the worse of the two bests (the value both reached)."""
    base, section = example(seed, early_stop=True)
    ours = simulate(base, section, clock, seed, toy)
    base, section = example(seed, early_stop=False, gpu_hours=ours.gpu_s / 3600, max_trials=10_000)
    plain = simulate(base, section, clock, seed, toy)
    target = max(ours.best, plain.best)
    return {"seed": seed, "asha": ours, "random": plain, "target": target,
            "asha_gpu_s_to_target": ours.gpu_s_to_reach(target), "random_gpu_s_to_target": plain.gpu_s_to_reach(target)}
