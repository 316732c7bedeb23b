"""Slurm's commands and their parsing (orchestrator/executors/slurm/commands.py): squeue's JSON of
Slurm 22.05 and of newer Slurm, its plain format, sbatch's output, and wait statuses.
"""

from __future__ import annotations

import json

import pytest

from orchestrator.executors.slurm.commands import (
    JobStatus,
    SlurmError,
    parse_job_id,
    parse_squeue_json,
    parse_squeue_plain,
    wait_status_code,
)

SQUEUE_22_05 = json.dumps({"meta": {}, "errors": [], "jobs": [
    {"job_id": 21, "name": "runyard-r7-a1-abcdef", "job_state": "RUNNING", "state_reason": "None", "nodes": "localhost",
     "exit_code": 0},
    {"job_id": 22, "name": "other", "job_state": "PENDING", "state_reason": "Resources", "nodes": "", "exit_code": 0},
    {"job_id": 20, "name": "old", "job_state": "FAILED", "state_reason": "NonZeroExitCode", "nodes": "localhost",
     "exit_code": 768},
]})

# Newer Slurm wraps states in lists and numbers in {"set", "number"} objects.
SQUEUE_24 = json.dumps({"jobs": [
    {"job_id": 5, "name": "n", "job_state": ["PENDING"], "state_reason": "Priority", "nodes": "",
     "exit_code": {"status": ["PENDING"], "return_code": {"set": False, "number": 0}}},
]})


def test_squeue_json_of_22_05_and_of_newer_slurm() -> None:
    jobs = parse_squeue_json(SQUEUE_22_05)
    assert jobs["21"] == JobStatus("21", "runyard-r7-a1-abcdef", "RUNNING", "None", "localhost", None)
    assert (jobs["22"].state, jobs["22"].reason) == ("PENDING", "Resources")
    assert jobs["20"].exit_code == 3  # the batch program's wait status 768 = exit 3
    assert parse_squeue_json(SQUEUE_24)["5"] == JobStatus("5", "n", "PENDING", "Priority", "", None)


def test_squeue_plain_format_and_sbatch_output() -> None:
    jobs = parse_squeue_plain("21|runyard-r7-a1|RUNNING|None|localhost\n22|x|PENDING|Priority|\nnoise\n")
    assert jobs["21"].nodes == "localhost" and jobs["22"].reason == "Priority" and len(jobs) == 2
    assert parse_job_id("1234\n") == "1234" and parse_job_id("77;cluster\n") == "77"
    with pytest.raises(SlurmError, match="no job id"):
        parse_job_id("sbatch: error: Batch job submission failed\n")


@pytest.mark.parametrize(("status", "code"), [(0, 0), (768, 3), (36608, 143), (9, -9), (15, -15)])
def test_wait_status_as_exit_code(status: int, code: int) -> None:
    assert wait_status_code(status) == code
