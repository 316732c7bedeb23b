"""A script under trainer/process/script_runner.py ends as ``python SCRIPT`` would, short of the
interpreter's finalisation (trainer/process/process_exit.py): its non-daemon threads finish, its
``atexit`` handlers run, the writes of a file it left open reach the disk, and torchrun gets the
exit code ``python`` gives (a ``sys.exit`` code; 1 and the traceback on standard error for an
exception, which the scheduler then reports as the script's)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from orchestrator.scheduler.failures import parse_traceback
from trainer.process import process_exit

ROOT = Path(__file__).resolve().parents[2]
RUNNER = ROOT / "trainer" / "process" / "script_runner.py"

# A script that relies on the interpreter's shutdown three ways, then ends as its argument says.
SCRIPT = textwrap.dedent("""\
    import atexit, sys, threading, time
    import keeper

    def late():
        time.sleep(0.5)
        with open("thread.txt", "w") as f:
            f.write("joined")

    def at_exit():
        with open("atexit.txt", "w") as f:
            f.write("ran")

    threading.Thread(target=late).start()  # not a daemon: python waits for it
    atexit.register(at_exit)
    keeper.LOG = open("unclosed.txt", "w")  # a module keeps it open; never flushed nor closed
    keeper.LOG.write("buffered")
    print("done", end="")  # no newline: still in standard output's buffer
    how = sys.argv[1]
    if how == "exit3":
        sys.exit(3)
    if how == "exit_message":
        sys.exit("no data")
    if how == "raise":
        raise ValueError("boom")
""")


def run_script(tmp_path: Path, how: str, by_path: bool) -> subprocess.CompletedProcess[str]:
    (tmp_path / "train.py").write_text(SCRIPT)
    (tmp_path / "keeper.py").write_text("LOG = None\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RUNYARD_", "TORCHELASTIC_"))}
    # By its path under -I, as under another interpreter (workload.python); else as torchrun's -m.
    command = ([sys.executable, "-I", str(RUNNER)] if by_path
               else [sys.executable, "-m", "trainer.process.script_runner", "--workdir", str(tmp_path)])
    if not by_path:
        env["PYTHONPATH"] = str(ROOT)
    return subprocess.run([*command, str(tmp_path / "train.py"), how], capture_output=True, text=True,
                          cwd=tmp_path if by_path else ROOT, env=env, timeout=60)


def outputs(folder: Path) -> dict[str, str | None]:
    return {name: (folder / name).read_text() if (folder / name).exists() else None
            for name in ("thread.txt", "atexit.txt", "unclosed.txt")}


EVERY_OUTPUT = {"thread.txt": "joined", "atexit.txt": "ran", "unclosed.txt": "buffered"}


@pytest.mark.parametrize("by_path", [False, True], ids=["module", "by-path"])
@pytest.mark.parametrize(("how", "code"), [("return", 0), ("exit3", 3), ("exit_message", 1)])
def test_the_script_ends_with_its_code_after_what_python_s_shutdown_does(
        tmp_path: Path, how: str, code: int, by_path: bool) -> None:
    out = run_script(tmp_path, how, by_path)
    assert out.returncode == code, out.stderr
    assert out.stdout == "done"
    assert outputs(tmp_path) == EVERY_OUTPUT
    assert out.stderr == ("no data\n" if how == "exit_message" else "")


@pytest.mark.parametrize("by_path", [False, True], ids=["module", "by-path"])
def test_a_script_that_raises_exits_1_with_its_traceback_for_the_scheduler(tmp_path: Path, by_path: bool) -> None:
    out = run_script(tmp_path, "raise", by_path)
    assert out.returncode == 1
    assert outputs(tmp_path) == EVERY_OUTPUT  # its shutdown still ran
    raised = parse_traceback(out.stderr)  # what the scheduler reads from the rank's stderr
    assert raised is not None, out.stderr
    assert raised.exception == "ValueError: boom"
    assert raised.location == "train.py:24 in <module>"


def test_an_atexit_handler_that_raises_is_reported_and_the_code_kept(tmp_path: Path) -> None:
    script = tmp_path / "s.py"
    script.write_text("import atexit\natexit.register(print, 'second')\natexit.register(lambda: 1 / 0)\n")
    out = subprocess.run([sys.executable, "-I", str(RUNNER), str(script)], capture_output=True, text=True,
                         cwd=tmp_path, timeout=60)
    assert out.returncode == 0
    assert out.stdout == "second\n"
    assert "ZeroDivisionError" in out.stderr


def test_flushing_the_files_left_open_finds_them_and_costs_little(tmp_path: Path) -> None:
    left_open = [open(tmp_path / f"f{i}.txt", "w") for i in range(3)]  # noqa: SIM115 - left open on purpose
    for f in left_open:
        f.write("x")
    binary = open(tmp_path / "b.bin", "w+b")  # noqa: SIM115 - left open on purpose (a BufferedRandom)
    binary.write(b"y")
    start = time.perf_counter()
    flushed = process_exit.flush_open_files()
    took = time.perf_counter() - start
    try:
        assert flushed >= 4
        assert [(tmp_path / f"f{i}.txt").read_text() for i in range(3)] == ["x"] * 3
        assert (tmp_path / "b.bin").read_bytes() == b"y"
        assert took < 2.0, took  # one pass over the objects the collector tracks
    finally:
        for f in left_open:
            f.close()
        binary.close()
