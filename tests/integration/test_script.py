"""Your own torchrun script under runyard: with the SDK it gains per-rank metrics, checkpoints
and resume; without it, it is still launched, logged, and retried on failure."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from tests.integration.conftest import ROOT, Product

pytestmark = pytest.mark.slow
# The tests share one installation and scheduler, and read their own runs by id
# (tests/integration/conftest.py: product).
SHARES_ONE_SCHEDULER = True


def submit_script(product: Product, script: str, *overrides: str) -> int:
    config = product.home / "script.toml"
    config.write_text(f'name = "script"\n[workload]\nkind = "script"\nscript = "{ROOT / "examples" / script}"\n'
                      'args = ["--steps", "200"]\n')
    return product.submit_file(config, *overrides)  # as `runyard submit CONFIG --set ...`, without its process


def test_sdk_script_reports_metrics_checkpoints_and_resumes(product: Product) -> None:
    run_id = submit_script(product, "ddp_runyard.py", "checkpoint.keep_last=0")
    product.start_scheduler()
    detail = product.wait_status(run_id, "SUCCEEDED", "FAILED")
    assert detail["status"] == "SUCCEEDED", detail["status_reason"]
    assert set(detail["metrics"]["loss"]) == {"0", "1"}
    assert [c["step"] for c in detail["checkpoints"]] == [50, 100, 150, 200]
    assert all(c["verified"] and len(c["params_digest"]) == 64 for c in detail["checkpoints"])

    product.cli("resume", str(run_id), "--step", "100")
    detail = product.wait_status(run_id, "SUCCEEDED", "FAILED")
    assert detail["status"] == "SUCCEEDED", detail["status_reason"]
    second = detail["attempts"][-1]
    assert second["number"] == 2 and second["resume_step"] == 100, [
        (a["number"], a["cause"], a["exception"]) for a in detail["attempts"]]
    con = sqlite3.connect(product.home / "runyard.db")
    first_step = con.execute("SELECT MIN(step) FROM metrics WHERE run_id = ? AND attempt = 2", (run_id,)).fetchone()[0]
    con.close()
    assert first_step == 110  # it continued after the checkpoint instead of starting over
    # The abandoned lineage's 150 and 200 were moved aside, not overwritten: both lineages stay
    # in the history, each checkpoint in its own folder.
    live = [c for c in detail["checkpoints"] if not c["deleted"]]
    by_step = {step: sorted(c["path"] for c in live if c["step"] == step) for step in (150, 200)}
    for paths in by_step.values():
        assert len(paths) == 2 and sum("superseded" in p for p in paths) == 1, paths
        assert all(Path(p).is_dir() for p in paths), paths


def test_plain_script_is_supervised_without_the_sdk(product: Product) -> None:
    run_id = submit_script(product, "ddp_plain.py")
    product.start_scheduler()
    detail = product.wait_status(run_id, "SUCCEEDED", "FAILED")
    assert detail["status"] == "SUCCEEDED", detail["status_reason"]
    assert detail["metrics"] == {} and detail["checkpoints"] == []
    assert "step 200 loss" in product.cli("logs", str(run_id), "--rank", "0").stdout
    assert detail["cost_usd"] > 0


def test_failing_plain_script_is_retried_then_fails(product: Product) -> None:
    """A plain script that raises is retried (it reports no step, so runyard cannot tell how far it
    got) and fails once the same exception comes back; one whose argparse refuses its arguments
    fails at once: the same command line would be refused again."""
    run_id = submit_script(product, "ddp_plain.py", "workload.args=['--lr', '-1']",
                           "retry.max_retries=3", "retry.backoff_s=0.5")
    refused = submit_script(product, "ddp_plain.py", "workload.args=['--steps', 'many']",
                            "retry.max_retries=3", "retry.backoff_s=0.5")
    product.start_scheduler()
    detail = product.wait_status(run_id, "SUCCEEDED", "FAILED")
    assert detail["status"] == "FAILED"
    assert len(detail["attempts"]) == 2 and "same exception twice" in detail["status_reason"], detail["status_reason"]
    assert all(a["exit_code"] not in (0, None) for a in detail["attempts"])
    assert "Invalid learning rate: -1.0" in product.cli("logs", str(run_id)).stdout

    detail = product.wait_status(refused, "SUCCEEDED", "FAILED")
    assert detail["status"] == "FAILED" and len(detail["attempts"]) == 1
    (attempt,) = detail["attempts"]
    assert attempt["cause"] == "USER_ERROR"
    assert "ddp_plain.py: error: argument --steps: invalid int value: 'many'" in attempt["exception"]
    assert "fix the script's arguments (workload.args)" in detail["status_reason"]


def test_missing_script_is_refused_at_submit(product: Product) -> None:
    config = product.home / "bad.toml"
    config.write_text('[workload]\nkind = "script"\nscript = "does/not/exist.py"\n')
    before = sorted(r["id"] for r in json.loads(product.cli("ls", "--json").stdout))  # the module's earlier runs
    result = product.cli("submit", str(config), check=False)
    assert result.returncode == 2
    assert "workload.script = 'does/not/exist.py': no such file" in result.stderr
    assert sorted(r["id"] for r in json.loads(product.cli("ls", "--json").stdout)) == before


# docs/SCRIPTS.md's stop pattern, exactly: should_stop() asked twice a step.
README_PATTERN_SCRIPT = """
import time

import torch
import torch.distributed as dist

import runyard

dist.init_process_group("gloo")
run = runyard.init()
model = torch.nn.Linear(4, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
start = run.load_checkpoint({"model": model, "optimizer": opt})
for step in range(start + 1, 1_000_000):
    loss = model(torch.ones(8, 4)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    time.sleep(0.005)
    run.log(step, loss=loss.detach())
    if dist.get_rank() == 0 and step % 50 == 0:  # an evaluation on rank 0 alone, as nanoGPT's
        run.log_rank0(step, eval_loss=float(step))
    if step % 100 == 0 or run.should_stop():
        run.save_checkpoint(step, {"model": model, "optimizer": opt})
    if run.should_stop():
        break
run.finish()
dist.barrier()
dist.destroy_process_group()
"""


def test_readme_stop_pattern_saves_the_step_it_pauses_at(product: Product) -> None:
    script = product.home / "readme_pattern.py"
    script.write_text(README_PATTERN_SCRIPT)
    config = product.home / "readme.toml"
    config.write_text(f'name = "readme"\n[workload]\nkind = "script"\nscript = "{script}"\n')
    run_id = int(product.cli("submit", str(config), "--set", "checkpoint.keep_last=0").stdout.strip())
    product.start_scheduler()
    product.wait_step(run_id, 150)
    product.cli("pause", str(run_id))
    detail = product.wait_status(run_id, "PAUSED", "CANCELLED", "FAILED", "SUCCEEDED", timeout=90)
    assert detail["status"] == "PAUSED", detail["status_reason"]
    (attempt,) = detail["attempts"]
    assert "with a checkpoint" in attempt["reason"], attempt["reason"]
    # The last checkpoint is the stop step itself, not the last multiple of 100.
    assert attempt["last_checkpoint_step"] == attempt["last_step"] and attempt["last_step"] > 150, attempt
    stop_step = attempt["last_step"]
    assert any(c["step"] == stop_step and c["verified"] for c in detail["checkpoints"]), detail["checkpoints"]
    # Rank 0's own metric: written for rank 0 alone, no NaN rows for the others.
    assert set(detail["metrics"]["eval_loss"]) == {"0"}, detail["metrics"]["eval_loss"]


# A script folder that holds modules named like runyard's four packages (issue 27, item 7).
OWN_MODULES = ("app", "db", "trainer", "orchestrator")
CHECK_OWN = """
import app, db, orchestrator, trainer
mine = [m.MINE for m in (app, db, orchestrator, trainer)]
assert mine == ["app", "db", "orchestrator", "trainer"], mine
"""
SDK_WITH_OWN_MODULES = CHECK_OWN + """
import torch
import torch.distributed as dist

import runyard

dist.init_process_group("gloo")
run = runyard.init()
model = torch.nn.Linear(4, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(1, 21):
    loss = model(torch.ones(8, 4)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    run.log(step, loss=loss.detach())
run.save_checkpoint(20, {"model": model, "optimizer": opt})
run.finish()
""" + CHECK_OWN + """
import db as again
assert again is db and again.MINE == "db"
print("own modules stayed its own", flush=True)
dist.destroy_process_group()
"""
PLAIN_WITH_OWN_MODULES = CHECK_OWN + """
import torch.distributed as dist
dist.init_process_group("gloo")
dist.barrier()
print("own modules stayed its own", flush=True)
dist.destroy_process_group()
"""


def test_a_scripts_own_app_db_trainer_and_orchestrator_stay_its_own_and_runyards_work(product: Product) -> None:
    """A real 2-rank run of an SDK script and of a plain one, each beside its own app.py, db.py,
    trainer.py and orchestrator.py: the scripts get their own modules (before and after the SDK
    loads), and runyard's SDK still reports metrics and a verified checkpoint. Before the fix the
    SDK's ``from db.vocabulary.config import ...`` found the script's db.py and the rank died."""
    folder = product.home / "own"
    folder.mkdir()
    for name in OWN_MODULES:
        (folder / f"{name}.py").write_text(f"MINE = {name!r}\n")
    runs = {}
    for kind, text in (("sdk", SDK_WITH_OWN_MODULES), ("plain", PLAIN_WITH_OWN_MODULES)):
        (folder / f"{kind}.py").write_text(text)
        config = product.home / f"{kind}.toml"
        config.write_text(f'name = "own-{kind}"\n[workload]\nkind = "script"\nscript = "{folder / kind}.py"\n')
        runs[kind] = int(product.cli("submit", str(config), "--set", "checkpoint.keep_last=0").stdout.strip())
    product.start_scheduler()
    for kind, run_id in runs.items():
        detail = product.wait_status(run_id, "SUCCEEDED", "FAILED", "CANCELLED")
        assert detail["status"] == "SUCCEEDED", (kind, detail["status_reason"])
        for rank in ("0", "1"):
            assert "own modules stayed its own" in product.cli("logs", str(run_id), "--rank", rank).stdout, (kind, rank)
    sdk = product.detail(runs["sdk"])
    assert set(sdk["metrics"]["loss"]) == {"0", "1"}
    assert [(c["step"], c["verified"]) for c in sdk["checkpoints"]] == [(20, True)]
