"""Scripts written like third-party ones (tests/scripts/: nanoGPT, pytorch/examples' DDP tutorial,
a TensorBoard writer, a wandb user, a minGPT-style project), run unchanged under runyard with real
2-rank torchrun, checked as their user would check them: through `runyard show --json`, `runyard
metrics`, `runyard stacks` and the attempt's folder."""

from __future__ import annotations

import csv
import io
import json
import os
import shutil
import site
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.conftest import ROOT, Product

pytestmark = pytest.mark.slow
# The tests share one installation and scheduler, and read their own runs by id
# (tests/integration/conftest.py: product).
SHARES_ONE_SCHEDULER = True

SCRIPTS = ROOT / "tests" / "scripts"
NANOGPT_LOSS = r"iter (?P<step>\d+): loss (?P<value>[\d.]+)"
TERMINAL = ("SUCCEEDED", "FAILED", "CANCELLED", "PAUSED")


def toml_value(value: object) -> str:
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} = {toml_value(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, str):
        return "'" + value + "'"  # a TOML literal string: regexes keep their backslashes
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def submit(product: Product, name: str, workload: dict, *, cwd: Path | None = None, **sections: dict) -> int:
    """Write a config with ``[workload]`` (kind = "script") and the other sections, and submit it
    from ``cwd`` (as a user would, from their own folder)."""
    lines = [f'name = "{name}"', "[workload]", 'kind = "script"']
    lines += [f"{key} = {toml_value(value)}" for key, value in workload.items()]
    for section, values in sections.items():
        lines.append(f"[{section}]")
        lines += [f"{key} = {toml_value(value)}" for key, value in values.items()]
    config = product.home / f"{name}.toml"
    config.write_text("\n".join(lines) + "\n")
    env = {**product.env, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), product.env.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "-m", "orchestrator", "submit", str(config)], env=env,
                          cwd=cwd or product.home, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return int(done.stdout.strip())


def copy_of(name: str, tmp_path: Path) -> Path:
    target = tmp_path / name
    shutil.copytree(SCRIPTS / name, target)
    return target


def metric_rows(product: Product, run_id: int, key: str) -> dict[int, list[tuple[int, float]]]:
    """``runyard metrics RUN`` for one key: {rank: [(step, value), ...]} in step order."""
    out: dict[int, list[tuple[int, float]]] = {}
    for row in csv.DictReader(io.StringIO(product.cli("metrics", str(run_id)).stdout)):
        if row["key"] == key:
            out.setdefault(int(row["rank"]), []).append((int(row["step"]), float(row["value"])))
    return {rank: sorted(points) for rank, points in out.items()}


def events(detail: dict, kind: str) -> list[str]:
    return [e["message"] for e in detail["events"] if e["kind"] == kind]


def test_nanogpt_runs_in_its_own_folder_with_live_loss_and_fails_clearly_outside_it(
        product: Product, tmp_path: Path) -> None:
    folder = copy_of("nanogpt", tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    workload = {"script": str(folder / "train.py"), "args": ["config/train_tiny_char.py", "--iter_sleep=0.05"],
                "max_steps": 100, "stdout_metrics": {"loss": NANOGPT_LOSS}}
    good = submit(product, "nanogpt", {**workload, "workdir": str(folder)}, cwd=elsewhere)
    # The same submitted from another folder without workdir: the ranks run there, where
    # nanoGPT's exec(open('configurator.py')) finds nothing.
    bad = submit(product, "nanogpt-nowhere", workload, cwd=elsewhere, retry={"max_retries": 3, "backoff_s": 0.2})
    product.start_scheduler()

    live = product.wait_for(good, lambda d: d["status"] in TERMINAL or (
        d["metrics"].get("loss", {}).get("0") is not None and d["step"] >= 5))
    assert live["status"] == "RUNNING", live["status_reason"]  # seen while it trains, not after
    assert list(live["metrics"]["loss"]) == ["0"]  # nanoGPT prints on its master process only
    assert live["max_steps"] == 100 and 0 < live["progress"] < 1
    assert live["config"]["workload"]["workdir"] == str(folder)
    detail = product.wait_status(good, *TERMINAL)
    assert detail["status"] == "SUCCEEDED", detail["status_reason"]
    assert detail["step"] == 100 and detail["attempts"][0]["watching"] == "steps"
    assert (folder / "out" / "ckpt.pt").is_file()  # its relative out_dir, in its own folder
    assert not (elsewhere / "out").exists()

    detail = product.wait_status(bad, *TERMINAL)
    assert detail["status"] == "FAILED"
    first = detail["attempts"][0]
    assert first["cause"] == "USER_ERROR", first
    assert "FileNotFoundError" in first["exception"] and "configurator.py" in first["exception"], first
    assert detail["config"]["workload"]["workdir"] == str(elsewhere)
    # The same exception twice: it stopped there, not after retry.max_retries = 3.
    assert len(detail["attempts"]) == 2, [a["reason"] for a in detail["attempts"]]
    assert "the same exception" in detail["status_reason"] and "retrying cannot help" in detail["status_reason"]


def test_tensorboard_tags_and_protocol_total_and_a_stack_dump_that_stops_nothing(product: Product,
                                                                                  tmp_path: Path) -> None:
    workdir = tmp_path / "work"
    workdir.mkdir()
    steps = 60
    run_id = submit(product, "plain", {"script": str(SCRIPTS / "plain_metrics.py"), "workdir": str(workdir),
                                       "args": ["--steps", str(steps), "--sleep", "0.1"]})
    product.start_scheduler()
    # The steps of the TensorBoard file can be read before the RUNYARD line at step 5 that gives
    # the total: wait for both.
    running = product.wait_for(run_id, lambda d: d["status"] in TERMINAL or (d["step"] >= 5 and d["max_steps"]))
    assert running["status"] == "RUNNING", running["status_reason"]
    # The RUNYARD line's total is the progress total (the config gave none).
    assert running["max_steps"] == steps and 0 < running["progress"] < 1
    assert running["attempts"][0]["watching"] == "steps"

    product.cli("stacks", str(run_id))
    dumped = product.wait_for(run_id, lambda d: bool(events(d, "stacks")) or d["status"] in TERMINAL, timeout=60)
    assert events(dumped, "stacks"), dumped["status"]
    assert dumped["status"] == "RUNNING", dumped["status_reason"]  # nothing was stopped
    stacks_dir = Path(dumped["attempts"][0]["dir"]) / "stacks"
    texts = [p.read_text() for p in stacks_dir.rglob("*") if p.is_file()]
    assert texts and all(t.strip() for t in texts), list(stacks_dir.rglob("*"))

    detail = product.wait_status(run_id, *TERMINAL)
    assert detail["status"] == "SUCCEEDED", detail["status_reason"]
    assert len(detail["attempts"]) == 1 and detail["step"] == steps  # the dump cost no attempt
    train = metric_rows(product, run_id, "train/loss")
    assert {rank: [s for s, _ in pts] for rank, pts in train.items()} == {
        0: list(range(1, steps + 1)), 1: list(range(1, steps + 1))}
    # eval/acc on its own counter, as written (1..6), not renumbered onto train/loss's steps.
    acc = metric_rows(product, run_id, "eval/acc")
    assert {rank: [s for s, _ in pts] for rank, pts in acc.items()} == {
        0: list(range(1, steps // 10 + 1)), 1: list(range(1, steps // 10 + 1))}
    assert acc[1][0][1] == pytest.approx(0.5 + 10 / 100 + 1 / 1000)


def test_wandb_calls_land_in_runyards_store(product: Product, tmp_path: Path) -> None:
    workdir = tmp_path / "work"
    workdir.mkdir()
    run_id = submit(product, "wandb", {"script": str(SCRIPTS / "wandb_user.py"), "workdir": str(workdir),
                                       "args": ["--steps", "20"], "env": {"RUNYARD_WANDB_SHIM": "1"}})
    product.start_scheduler()
    detail = product.wait_status(run_id, *TERMINAL)
    assert detail["status"] == "SUCCEEDED", detail["status_reason"]
    loss = metric_rows(product, run_id, "train/loss")
    assert list(loss) == [0] and [s for s, _ in loss[0]] == list(range(20))  # wandb's steps, as logged
    assert not (workdir / "wandb").exists()  # nothing of wandb's own


def test_a_raise_on_rank_1_is_a_user_error_that_stops_on_its_second_time(product: Product, tmp_path: Path) -> None:
    folder = copy_of("ddp_tutorial", tmp_path)
    run_id = submit(product, "ddp-raise", {"script": str(folder / "multigpu_torchrun.py"), "workdir": str(folder),
                                           "args": ["20", "100"], "env": {"FAULT_RAISE_AT": "50:1",
                                                                           "STEP_SLEEP": "0.01"}},
                    retry={"max_retries": 5, "backoff_s": 0.2})
    product.start_scheduler()
    detail = product.wait_status(run_id, *TERMINAL)
    assert detail["status"] == "FAILED"
    assert len(detail["attempts"]) == 2, [a["reason"] for a in detail["attempts"]]
    for attempt in detail["attempts"]:
        assert attempt["cause"] == "USER_ERROR" and attempt["failed_rank"] == 1, attempt
        assert attempt["exception"].startswith("ValueError: bad batch at step 50 (at multigpu_torchrun.py:"), attempt
        assert "rank 1" in attempt["reason"], attempt["reason"]
    reason = detail["status_reason"]
    assert "the same exception" in reason and "ValueError: bad batch at step 50" in reason, reason
    assert "retrying cannot help" in reason and "None" not in reason, reason


def test_a_frozen_rank_of_a_plain_script_is_caught_by_its_silence(product: Product, tmp_path: Path) -> None:
    folder = copy_of("ddp_tutorial", tmp_path)
    run_id = submit(product, "ddp-freeze", {"script": str(folder / "multigpu_torchrun.py"), "workdir": str(folder),
                                            "args": ["50", "100"], "env": {"FAULT_FREEZE_AT": "10:1"}},
                    retry={"max_retries": 0}, supervision={"hang_timeout_s": 8})
    product.start_scheduler()
    detail = product.wait_status(run_id, *TERMINAL, timeout=120)
    assert detail["status"] == "FAILED"
    (attempt,) = detail["attempts"]
    assert attempt["cause"] == "HANG" and attempt["watching"] == "output", attempt
    (hang,) = events(detail, "hang")
    assert "no output from the script" in hang, hang
    assert events(detail, "stacks"), detail["events"]
    assert any(p.is_file() for p in (Path(attempt["dir"]) / "stacks").rglob("*"))
    assert any("watches the script's output" in m for m in events(detail, "watch")), detail["events"]
    # Caught within the timeout plus a few ticks and the dump, not minutes later.
    assert attempt["ended_at"] - attempt["started_at"] < 60


def test_mingpt_layout_uses_its_own_trainer_and_stops_with_a_checkpoint(product: Product, tmp_path: Path) -> None:
    folder = copy_of("mingpt", tmp_path)
    workload = {"script": str(folder / "main.py"), "workdir": str(folder),
                "args": ["--steps", "1000", "--sleep", "0.05"]}
    paused = submit(product, "mingpt-pause", workload, checkpoint={"keep_last": 0})
    cancelled = submit(product, "mingpt-cancel", workload, checkpoint={"keep_last": 0})
    product.start_scheduler()
    for run_id, verb, status in ((paused, "pause", "PAUSED"), (cancelled, "cancel", "CANCELLED")):
        product.wait_step(run_id, 12)
        product.cli(verb, str(run_id))
        detail = product.wait_status(run_id, *TERMINAL, timeout=90)
        assert detail["status"] == status, detail["status_reason"]
        (attempt,) = detail["attempts"]
        assert "with a checkpoint" in attempt["reason"], attempt["reason"]
        newest = max(c["step"] for c in detail["checkpoints"] if c["verified"])
        assert newest == attempt["last_step"] == attempt["last_checkpoint_step"], (verb, attempt)
        assert set(detail["metrics"]["loss"]) == {"0", "1"}


def make_venv(tmp_path: Path) -> Path:
    """A virtual environment of its own that has torch: made without pip (fast), with this
    environment's site-packages added by a .pth file (as --system-site-packages would for a
    system Python)."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", "--system-site-packages", str(venv)], check=True)
    (site_dir,) = (venv / "lib").glob("python*/site-packages")
    (site_dir / "parent.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    return venv


PRINT_ENV = """
import json, os, sys
print("ENV " + json.dumps({"executable": sys.executable, "omp": os.environ.get("OMP_NUM_THREADS"),
                           "rank": os.environ["RANK"], "argv": sys.argv[1:], "cwd": os.getcwd()}), flush=True)
"""


def env_lines(product: Product, run_id: int) -> list[dict]:
    out = product.cli("logs", str(run_id)).stdout
    return [json.loads(line.split("ENV ", 1)[1]) for line in out.splitlines() if "ENV {" in line]


def test_module_python_and_omp_threads_and_a_run_without_steps(product: Product, tmp_path: Path) -> None:
    project = tmp_path / "project"
    (project / "pkg").mkdir(parents=True)
    (project / "pkg" / "__init__.py").write_text("")
    (project / "pkg" / "train.py").write_text(PRINT_ENV)
    venv = make_venv(tmp_path)
    by_module = submit(product, "module", {"module": "pkg.train", "args": ["--flag"], "python": str(venv)},
                       cwd=project)
    by_script = submit(product, "omp", {"script": str(project / "pkg" / "train.py"), "workdir": str(project),
                                        "env": {"OMP_NUM_THREADS": "3"}})
    product.start_scheduler()

    detail = product.wait_status(by_module, *TERMINAL)
    assert detail["status"] == "SUCCEEDED", detail["status_reason"]
    assert "the script reported no step" in detail["status_reason"], detail["status_reason"]
    assert any("reported no step" in e["message"] and e["level"] == "warning" for e in detail["events"])
    assert detail["config"]["workload"]["python"] == str(venv / "bin" / "python")
    seen = env_lines(product, by_module)
    assert sorted(e["rank"] for e in seen) == ["0", "1"]
    cores = len(os.sched_getaffinity(0))
    for e in seen:
        assert e["executable"] == str(venv / "bin" / "python"), e
        assert e["omp"] == str(max(1, cores // 2)) and e["argv"] == ["--flag"] and e["cwd"] == str(project), e

    detail = product.wait_status(by_script, *TERMINAL)
    assert detail["status"] == "SUCCEEDED", detail["status_reason"]
    assert {e["omp"] for e in env_lines(product, by_script)} == {"3"}


def test_scalars_written_in_the_last_second_before_exit_are_all_read(product: Product, tmp_path: Path) -> None:
    """The ranks' last second: new event files, closed, then exit, all before runyard's next search
    for event files is due. They are read to the end before the attempt is settled."""
    workdir = tmp_path / "work"
    workdir.mkdir()
    run_id = submit(product, "last-second", {"script": str(SCRIPTS / "last_second.py"), "workdir": str(workdir),
                                             "args": ["--steps", "100", "--warmup", "1"]})
    product.start_scheduler()
    detail = product.wait_status(run_id, *TERMINAL)
    assert detail["status"] == "SUCCEEDED", detail["status_reason"]
    loss = metric_rows(product, run_id, "train/loss")
    assert {rank: [s for s, _ in pts] for rank, pts in loss.items()} == {
        0: list(range(0, 100, 10)), 1: list(range(0, 100, 10))}
    assert detail["step"] == 90 and not [e for e in detail["events"] if "reported no step" in e["message"]]


def test_an_exception_whose_handler_waits_for_the_other_ranks_is_the_user_s_error(product: Product) -> None:
    """Issue 52 item 4: Lightning's OnExceptionCheckpoint deadlocks an exception on one rank (its
    handler waits in a barrier, the others in all-reduce), which was booked "HANG ... the stacks do
    not single out one rank" and retried as a hang. The hang's stacks name the rank inside its
    handler and its exception, and the attempt is that rank's USER_ERROR (the retry policy's rules
    for one: tests/unit/orchestrator/scheduler/test_retry.py)."""
    run_id = submit(product, "handler-deadlock", {"script": str(SCRIPTS / "handler_deadlock.py")},
                    retry={"max_retries": 0}, supervision={"hang_timeout_s": 2})
    product.start_scheduler()
    detail = product.wait_status(run_id, *TERMINAL, timeout=120)
    assert detail["status"] == "FAILED", detail["status_reason"]
    (attempt,) = detail["attempts"]
    assert (attempt["cause"], attempt["failed_rank"]) == ("USER_ERROR", 1), attempt
    # py-spy shows the handled exception's type among the handler's variables, and where it waits.
    assert attempt["exception"] == "ValueError (handled at handler_deadlock.py:32 in main)", attempt
    assert "waited inside its exception handler for the other ranks" in attempt["reason"], attempt["reason"]
    (stacks,) = events(detail, "stacks")
    assert "rank 1 waits inside an exception handler (main at handler_deadlock.py:32)" in stacks, stacks
