"""A user's script started in each rank (trainer/process/script_runner.py) runs as ``python SCRIPT``
would: found beside its siblings, in its working directory after runyard's own imports, started
by its path under another interpreter with nothing of runyard's; and it ends as ``python SCRIPT``
would, short of the interpreter's finalisation (trainer/process/process_exit.py): its non-daemon
threads finish, its ``atexit`` handlers run, the writes of a file it left open reach the disk, and
torchrun gets the exit code ``python`` gives (a ``sys.exit`` code; 1 and the traceback on standard
error for an exception, which the scheduler then reports as the script's)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from orchestrator.scheduler.failures import parse_traceback
from tests.unit.paths import ROOT
from trainer.process import process_exit

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


def test_flushing_the_files_left_open_finds_every_one(tmp_path: Path) -> None:
    left_open = [open(tmp_path / f"f{i}.txt", "w") for i in range(3)]  # noqa: SIM115 - left open on purpose
    for f in left_open:
        f.write("x")
    binary = open(tmp_path / "b.bin", "w+b")  # noqa: SIM115 - left open on purpose (a BufferedRandom)
    binary.write(b"y")
    # Its cost (one pass over gc.get_objects(), 75 ms in a Trainer rank) is the docstring's number,
    # not asserted here: a bound on a shared machine's clock fails under load (2.09 s at load 7).
    flushed = process_exit.flush_open_files()
    try:
        assert flushed >= 4
        assert [(tmp_path / f"f{i}.txt").read_text() for i in range(3)] == ["x"] * 3
        assert (tmp_path / "b.bin").read_bytes() == b"y"
    finally:
        for f in left_open:
            f.close()
        binary.close()


def test_the_script_entry_runs_a_script_as_python_would(tmp_path: Path) -> None:
    (tmp_path / "helper.py").write_text("VALUE = 42\n")
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""
        import json, sys
        import helper  # a sibling module, found as `python train.py` would find it
        print(json.dumps({"name": __name__, "argv": sys.argv, "value": helper.VALUE}))
    """))
    result = subprocess.run([sys.executable, "-m", "trainer.process.script_runner", str(script), "--steps", "5"],
                            capture_output=True, text=True, timeout=30, cwd=os.getcwd(), check=False)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {"name": "__main__", "argv": [str(script), "--steps", "5"], "value": 42}


def test_the_script_entry_moves_into_the_workdir_after_runyards_imports(tmp_path: Path) -> None:
    """The user's folder holds modules named like runyard's packages (minGPT's trainer.py, a
    db.py): runyard's processes start elsewhere, and only the script sees the folder."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "trainer.py").write_text("OWN = True\n")
    (work / "db.py").write_text("raise SystemExit('the user db.py was imported by runyard')\n")
    (work / "pkg").mkdir()
    (work / "pkg" / "__init__.py").write_text("")
    (work / "pkg" / "train.py").write_text(textwrap.dedent("""
        import json, os, trainer
        print(json.dumps({"cwd": os.getcwd(), "own": getattr(trainer, "OWN", False)}))
    """))
    elsewhere = tmp_path / "run"
    elsewhere.mkdir()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for target in (["-m", "pkg.train"], [str(work / "pkg" / "train.py")]):
        result = subprocess.run([sys.executable, "-m", "trainer.process.script_runner", "--workdir", str(work),
                                 *target],
                                capture_output=True, text=True, timeout=30, cwd=elsewhere, env=env, check=False)
        assert result.returncode == 0, result.stderr
        seen = json.loads(result.stdout)
        assert seen["cwd"] == str(work)
        assert seen["own"] is (target[0] == "-m")  # a script's folder (pkg/) has no trainer.py: runyard's


def test_the_runner_started_by_its_path_needs_nothing_of_runyard(tmp_path: Path) -> None:
    script = tmp_path / "s.py"
    script.write_text("import sys\nprint(sys.argv[1:], 'trainer' in sys.modules, sys.path[0])\n")
    # -I: an isolated interpreter, as a foreign virtual environment would be (no PYTHONPATH, no site).
    out = subprocess.run([sys.executable, "-I", str(RUNNER), str(script), "a", "b"],
                         capture_output=True, text=True, cwd=tmp_path, check=True).stdout
    assert out.strip() == f"['a', 'b'] False {tmp_path}"
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "train.py").write_text("import os, sys\nprint(__name__, sys.argv[1:], sys.path[0] == os.getcwd())\n")
    out = subprocess.run([sys.executable, "-I", str(RUNNER), "-m", "pkg.train", "x"],
                         capture_output=True, text=True, cwd=tmp_path, check=True).stdout
    assert out.strip() == "__main__ ['x'] True"
