"""Entry point run under torchrun: ``torchrun ... -m trainer [--config attempt_dir/config.json]``.

Read the config, build the built-in workload of its kind (trainer/workloads/), join the run
through the SDK (``trainer.init``), then ``workload.setup(run)``, ``workload.train(run)`` and
``run.finish()``: the built-in workloads run on the same ``Run`` as your own scripts.

The scheduler launches it; it can also be run by hand with torchrun, in which case nothing is
reported to the database.
"""

from __future__ import annotations

import gc

if __name__ == "__main__":
    # A rank started cold imports torch and the trainer with the collector off; main() turns it
    # back on once they are in (trainer.process.lifecycle.settle_imports says why). A warm rank was
    # forked from an agent that has imported them already.
    gc.disable()

import argparse
import logging
import os
import sys
import time
from pathlib import Path

from torch.distributed.elastic.multiprocessing.errors import record

from db.states import AttemptPhase
from db.vocabulary.config import config_from_json
from trainer.agent.warm import started_warm
from trainer.context import context_from_env
from trainer.process import pdeathsig

logger = logging.getLogger("trainer")


def _parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m trainer")
    parser.add_argument("--config", type=Path, help="run config JSON (default: $RUNYARD_ATTEMPT_DIR/config.json)")
    return parser.parse_args(argv)


@record
def main(argv: list[str] | None = None) -> int:
    args = _parse_args(sys.argv[1:] if argv is None else argv)
    # Die with torchrun's agent: a rank orphaned by a killed agent must not train on beside the
    # attempt the scheduler launches next (trainer/process/pdeathsig.py).
    pdeathsig.arm_under_agent()
    ctx = context_from_env()
    rank = int(os.environ.get("RANK", "0"))
    logging.basicConfig(
        level=logging.INFO,
        format=f"%(asctime)s rank{rank} %(levelname)s %(name)s: %(message)s",
        stream=sys.stdout,
    )
    config = config_from_json((args.config or ctx.config_file).read_text())

    # Imported here so that `--help` and config errors do not pay for torch.
    from trainer.faults import EntryFaults  # noqa: PLC0415 - after the config is read: --help and config errors do not pay for torch
    from trainer.process import distributed  # noqa: PLC0415 - after the config is read: --help and config errors do not pay for torch
    from trainer.process.lifecycle import register_stack_dumps, settle_imports  # noqa: PLC0415 - after the config is read: --help and config errors do not pay for torch
    from trainer.sdk import init  # noqa: PLC0415 - after the config is read: --help and config errors do not pay for torch
    from trainer.workloads import build_workload  # noqa: PLC0415 - after the config is read: --help and config errors do not pay for torch

    imported = time.time()  # Python, torch and runyard's rank side are in (db/vocabulary/phases.py)
    settle_imports()
    workload = build_workload(config)  # refuses options it cannot honour before joining the others
    # The scheduler's stack dump (SIGUSR1) must not kill a rank still joining the others: dump
    # from now on (the Run registers its own file next).
    joining = register_stack_dumps(ctx.attempt_dir, rank) if ctx.managed else None
    # The process group is made here for every world size (FSDP's device mesh needs one even
    # for one rank); init() adopts it.
    distributed.setup(config.launch.backend)
    run = init(config=config, marks={"imported": imported, "joined": time.time()})
    if joining is not None:
        joining.close()
    started = "started warm (forked from torchrun's agent)" if started_warm() else "started cold (a fresh interpreter)"
    logger.info("run %s attempt %s: rank %d/%d on %s (%s), %s", ctx.run_id, ctx.attempt, run.rank, run.world_size,
                run.device, run.info.backend, started)
    faults = EntryFaults.installed(run.rank)  # None outside runyard's tests
    try:
        run.reporter.phase(AttemptPhase.SETUP)  # shown on the Run page until the first step
        if faults:
            faults.during_setup()
        workload.setup(run)
        run.reporter.phase(AttemptPhase.FIRST_STEP)
        summary = workload.train(run)
    except BaseException:
        run.close()  # a checkpoint being written lands and the metrics are flushed; no notes
        raise
    run.finish()  # the last checkpoint durable, then the finished note
    logger.info("finished: %s", summary)
    distributed.teardown()
    if faults:
        faults.at_exit()
    return 0


if __name__ == "__main__":
    from trainer.process.lifecycle import exit_without_finalising

    exit_without_finalising(main)
