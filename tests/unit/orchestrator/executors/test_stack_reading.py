"""Stack dumps read (orchestrator/executors/stack_reading.py): the rank a hang is blamed on, from
faulthandler's and py-spy's text, and the rank waiting inside its exception handler.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from orchestrator.executors.stack_reading import (
    Frame,
    RankStack,
    culprit,
    exception_in_locals,
    handler_frame,
    main_thread_frames,
)

# What faulthandler wrote for two gloo ranks of mlp-digits when rank 1 stalled before a step
# (RUNYARD_FAULT_STALL): rank 0 waits in DDP's backward, rank 1 sleeps in Python.
WAITING = """\
Thread 0x00007f6be7fff6c0 (most recent call first):
  File "/w/trainer/reporting/reporter.py", line 75 in _drain
  File "/usr/lib/python3.11/threading.py", line 1002 in _bootstrap

Current thread 0x00007f6c0e285b80 (most recent call first):
  File "/w/.venv/lib/python3.11/site-packages/torch/autograd/graph.py", line 979 in _engine_run_backward
  File "/w/.venv/lib/python3.11/site-packages/torch/autograd/__init__.py", line 395 in backward
  File "/w/trainer/workloads/mlp_digits.py", line 146 in train
  File "/w/.venv/lib/python3.11/site-packages/torch/distributed/elastic/multiprocessing/errors/__init__.py", line 367 in wrapper
  File "/w/trainer/__main__.py", line 77 in <module>
"""  # noqa: E501 (faulthandler's lines, verbatim)

STALLED = """\
Current thread 0x00007f0ae1006b80 (most recent call first):
  File "/w/trainer/faults.py", line 116 in maybe_stall
  File "/w/trainer/workloads/mlp_digits.py", line 124 in train
  File "/w/.venv/lib/python3.11/site-packages/torch/distributed/elastic/multiprocessing/errors/__init__.py", line 367 in wrapper
  File "/w/trainer/__main__.py", line 77 in <module>
"""  # noqa: E501 (faulthandler's lines, verbatim)

IN_ALL_REDUCE = """\
Thread 11851 (idle): "MainThread"
    all_reduce (torch/distributed/distributed_c10d.py:2950)
    train (ddp_plain.py:40)
"""


def test_the_one_rank_outside_the_collective_is_named() -> None:
    rank, why = culprit([RankStack(0, 10, False, WAITING), RankStack(1, 11, False, STALLED)])
    assert rank == 1
    assert why == ("rank 1 is outside any collective (maybe_stall at faults.py:116) while the other ranks wait "
                   "in one")
    assert culprit([RankStack(0, 10, False, STALLED), RankStack(1, 11, False, IN_ALL_REDUCE),
                    RankStack(2, 12, False, WAITING)])[0] == 0


def test_a_stopped_rank_is_named_before_the_stacks_are_read() -> None:
    rank, why = culprit([RankStack(0, 10, False, WAITING), RankStack(1, 11, True, WAITING)])
    assert rank == 1 and "stopped" in why


@pytest.mark.parametrize("ranks", [
    [RankStack(0, 10, False, WAITING), RankStack(1, 11, False, IN_ALL_REDUCE)],  # every rank waits
    [RankStack(0, 10, False, STALLED), RankStack(1, 11, False, STALLED)],  # nobody waits
    [RankStack(0, 10, False, WAITING), RankStack(1, 11, False, "")],  # one rank's stack is missing
    [RankStack(0, 10, True, STALLED), RankStack(1, 11, True, STALLED)],  # both stopped, neither waits
    [RankStack(0, 10, False, STALLED)],  # one rank alone: nothing to compare
])
def test_no_rank_is_named_when_the_evidence_does_not_single_one_out(ranks: list[RankStack]) -> None:
    assert culprit(ranks) == (None, "")


# -- a rank waiting inside its exception handler (issue 52, item 4) -----------------------------

# What py-spy showed of a Lightning rank under OnExceptionCheckpoint (Lightning #20187): the rank that
# raised saves from its handler, through a barrier, with --locals; lightning's frames as call.py has them.
LIGHTNING_LOCALS = """\
Thread 4242 (idle): "MainThread"
    barrier (/v/site-packages/torch/distributed/distributed_c10d.py:5356)
        Arguments:
            group: <torch._C._distributed_c10d.ProcessGroup at 0x7f2db1ad8670>
    barrier (/v/site-packages/lightning/pytorch/strategies/ddp.py:302)
    save_checkpoint (/v/site-packages/lightning/pytorch/trainer/trainer.py:1390)
        Arguments:
            self: <Trainer at 0x7f2d94c93bb0>
            filepath: "ckpts/on_exception.ckpt"
    on_exception (/v/site-packages/lightning/pytorch/callbacks/on_exception_checkpoint.py:68)
        Arguments:
            self: <OnExceptionCheckpoint at 0x7f2d94c93cc0>
            trainer: <Trainer at 0x7f2d94c93bb0>
            _: (<Regression at 0x7f2d94c93dd0>, <ValueError at 0x7f2d94c93ee0>)
    _call_callback_hooks (/v/site-packages/lightning/pytorch/trainer/call.py:228)
    _interrupt (/v/site-packages/lightning/pytorch/trainer/call.py:76)
        Arguments:
            exception: <ValueError at 0x7f2d94c93ee0>
    _call_and_handle_interrupt (/v/site-packages/lightning/pytorch/trainer/call.py:66)
    fit (/v/site-packages/lightning/pytorch/trainer/trainer.py:584)
"""

SCRIPT = """\
def main():
    try:
        train()
    except ValueError as exc:
        save()
        raise exc
"""


def test_a_frame_inside_an_except_block_or_lightning_s_handlers_is_a_handler_frame(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    assert handler_frame([Frame("barrier", "/v/torch/distributed/c10d.py", 9), Frame("main", str(script), 5)]) \
        == Frame("main", str(script), 5)
    assert handler_frame([Frame("main", str(script), 3)]) is None  # the try's body: every rank is there
    assert handler_frame([Frame("main", str(tmp_path / "gone.py"), 5)]) is None  # no source to read
    lightning = main_thread_frames(LIGHTNING_LOCALS)
    assert str(handler_frame(lightning)) == "on_exception at on_exception_checkpoint.py:68"
    # _call_and_handle_interrupt wraps fit on every rank: never a handler by its name.
    assert handler_frame([f for f in lightning if f.func in ("_call_and_handle_interrupt", "fit")]) is None
    assert exception_in_locals(LIGHTNING_LOCALS) == "ValueError"
    assert exception_in_locals(IN_ALL_REDUCE) is None


def test_the_rank_inside_its_exception_handler_is_named_with_its_exception() -> None:
    handler = Frame("on_exception", "/v/on_exception_checkpoint.py", 68)
    waiting = RankStack(0, 10, False, IN_ALL_REDUCE)
    raised = RankStack(1, 11, False, LIGHTNING_LOCALS, handler=handler, exception="ValueError")
    assert culprit([waiting, raised]) == (1, "rank 1 waits inside an exception handler (on_exception at "
                                             "on_exception_checkpoint.py:68): it raised ValueError and its handler "
                                             "waits for the other ranks, which wait elsewhere")
    # Every rank in a handler: no one rank raised alone (a stop signal reaches them all).
    assert culprit([replace(waiting, handler=handler), raised]) == (None, "")
