"""Warm ranks (trainer/agent/warm.py): a rank forked from torchrun's agent must look, from outside
and from inside, like the fresh interpreter torchrun would have started.

The fork is real: a stand-in agent (a Python process with the launcher's room in its environment,
a handler of its own for SIGTERM and a listening socket, as torchrun's agent has) forks a probe
module through ``fork_rank``. The probe reports what it sees; the agent reports what
``/proc/PID/environ`` and ``cmdline`` say of the child while it runs, and its exit code.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.unit.paths import ROOT
from trainer.agent import warm

PROBE = """
import json, os, signal, socket, sys, time
fds = {}
for fd in os.listdir("/proc/self/fd"):
    try:
        fds[int(fd)] = os.readlink(f"/proc/self/fd/{fd}")
    except FileNotFoundError:  # the listing's own descriptor
        pass
print(json.dumps({
    "argv": sys.argv, "rank": os.environ.get("RANK"), "room": os.environ.get("RUNYARD_WARM_ROOM"),
    "sigterm": str(signal.getsignal(signal.SIGTERM)), "sigint": signal.getsignal(signal.SIGINT).__name__,
    "fds": fds, "name": __name__, "sid_is_pid": os.getsid(0) == os.getpid(),
    "started_warm": __import__("trainer.agent.warm", fromlist=["x"]).started_warm(),
    "draws": [__import__("numpy").random.random(), __import__("random").random()],
}))
sys.stdout.flush()
time.sleep(float(os.environ.get("PROBE_SLEEP", "0")))
sys.exit(int(os.environ.get("PROBE_EXIT", "0")))
"""

AGENT = """
import json, os, random, signal, socket, sys, time
import numpy
from trainer.agent import warm
states = numpy.random.get_state(), random.getstate()
signal.signal(signal.SIGTERM, lambda *_: None)  # torchrun's agent handles SIGTERM
listener = socket.socket(); listener.bind(("127.0.0.1", 0)); listener.listen()
args = (sys.executable, "-u", "-m", "warm_probe")
env = dict(os.environ, RANK="3", LOCAL_RANK="1", PROBE_SLEEP=sys.argv[2], PROBE_EXIT=sys.argv[3])
env.update({f"TORCHELASTIC_VAR_{i}": "x" * 40 for i in range(20)})  # torchrun's variables take room
with open(sys.argv[1], "w") as out:
    rank = warm.fork_rank(args, env, out, out)
seen = {}
if float(sys.argv[2]) > 0:
    time.sleep(0.5)
    with open(f"/proc/{rank.pid}/environ", "rb") as f:
        seen["environ"] = [w.decode() for w in f.read().split(b"\\0") if w]
    with open(f"/proc/{rank.pid}/cmdline", "rb") as f:
        seen["cmdline"] = [w.decode() for w in f.read().split(b"\\0") if w]
    if sys.argv[4] == "term":
        os.killpg(rank.pid, signal.SIGTERM)  # as torchrun closes a rank: its session
seen["code"] = rank.wait(30)
numpy.random.set_state(states[0]); random.setstate(states[1])
seen["draws"] = [numpy.random.random(), random.random()]  # what the rank would draw had it kept the agent's
seen["listener_fd"] = listener.fileno()
print(json.dumps(seen))
"""


def fork_probe(tmp_path: Path, *, sleep: float = 0.0, exit_code: int = 0, then: str = "wait") -> tuple[dict, dict]:
    """Run the stand-in agent; (what it saw of the child, what the child printed)."""
    (tmp_path / "warm_probe.py").write_text(textwrap.dedent(PROBE))
    out = tmp_path / "rank.log"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), str(ROOT)]), **warm.room())
    result = subprocess.run([sys.executable, "-c", AGENT, str(out), str(sleep), str(exit_code), then],
                            env=env, capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    lines = out.read_text().splitlines()
    return json.loads(result.stdout), json.loads(lines[0]) if lines else {}


def test_a_forked_rank_shows_its_own_environment_and_command_to_ps_and_the_sweeper(tmp_path: Path) -> None:
    seen, inside = fork_probe(tmp_path, sleep=2.0)
    environ = dict(item.split("=", 1) for item in seen["environ"])
    assert environ["RANK"] == "3" and environ["LOCAL_RANK"] == "1"  # what the scheduler finds ranks by
    assert "RUNYARD_WARM_ROOM" not in environ  # the agent's room is not the rank's
    assert seen["cmdline"] == [sys.executable, "-u", "-m", "warm_probe"]
    assert seen["code"] == 0
    assert inside["rank"] == "3" and inside["room"] is None


def test_a_forked_rank_starts_as_a_fresh_interpreter_would(tmp_path: Path) -> None:
    seen, inside = fork_probe(tmp_path)
    assert inside["name"] == "__main__" and inside["argv"][1:] == []
    assert inside["argv"][0].endswith("warm_probe.py")
    assert inside["sigterm"] == str(signal.Handlers.SIG_DFL)  # the agent's own handler is not the rank's
    assert inside["sigint"] == "default_int_handler"
    assert inside["sid_is_pid"]  # a session of its own, as torchrun's Popen(start_new_session=True)
    assert inside["started_warm"]
    numpy_draw, python_draw = inside["draws"]
    assert numpy_draw != seen["draws"][0] and python_draw != seen["draws"][1]  # seeded anew, not the agent's
    # Standard output and error are the rank's log; the agent's socket is no longer open in it.
    assert inside["fds"]["1"].endswith("rank.log") and inside["fds"]["2"].endswith("rank.log")
    assert inside["fds"][str(seen["listener_fd"])] == os.devnull
    assert not [target for target in inside["fds"].values() if target.startswith("socket:")]


@pytest.mark.parametrize(("exit_code", "then", "expected"), [(7, "wait", 7), (0, "term", -signal.SIGTERM)])
def test_the_agent_sees_the_rank_end_as_torchrun_sees_a_process(tmp_path: Path, exit_code: int, then: str,
                                                                expected: int) -> None:
    seen, _ = fork_probe(tmp_path, sleep=5.0 if then == "term" else 0.0, exit_code=exit_code, then=then)
    assert seen["code"] == expected


def test_a_rank_starts_cold_when_it_cannot_start_warm() -> None:
    agent = warm.WarmAgent()
    trainer = (sys.executable, "-u", "-m", "trainer")
    assert agent.cold_reason(trainer, {}) == "the agent did not preload torch"
    agent.preloaded = True  # as after preload(), without paying for it here
    script = (sys.executable, "-u", "-m", "trainer.process.script_runner", "train.py")
    assert "not runyard's trainer" in (agent.cold_reason(script, {}) or "")
    assert "not runyard's trainer" in (agent.cold_reason(("numactl", "--cpunodebind=0", *trainer), {}) or "")
    huge = {"X": "y" * 1_000_000}
    assert "does not fit" in (agent.cold_reason(trainer, huge) or "")


def test_the_initial_areas_are_where_proc_reads_them() -> None:
    areas = warm.initial_areas()
    assert areas is not None
    (arg_start, arg_end), (env_start, env_end) = areas
    with open("/proc/self/cmdline", "rb") as f:
        assert ctypes.string_at(arg_start, arg_end - arg_start) == f.read()
    with open("/proc/self/environ", "rb") as f:
        assert ctypes.string_at(env_start, env_end - env_start) == f.read()


def test_a_process_that_loaded_the_cuda_driver_never_forks_ranks() -> None:
    maps = "7f00-7f10 r-xp 00000000 08:01 42 /usr/lib/x86_64-linux-gnu/libcuda.so.535.104.05\n"
    assert warm.cuda_driver_loaded(maps)
    assert not warm.cuda_driver_loaded("7f00-7f10 r-xp 00000000 08:01 42 /opt/torch/lib/libtorch_cpu.so\n")
    assert warm.encoded_block({"A": "1", "B": "2"}) == b"A=1\0B=2\0"
