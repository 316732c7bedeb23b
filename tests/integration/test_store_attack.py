"""Another local account cannot run code through a run's stores, join them or disturb the run
(issue 25, item 0; trainer/process/store_secret.py).

The attack of the report, for real: while a 2-rank run trains, an unprivileged account
(``nobody``) learns every port the run's processes listen on (as ``/proc/net/tcp`` shows anyone)
and the rendezvous id (from the agent's command line, as ``ps`` shows anyone), then against every
port sends junk, connects as a plain TCPStore client, reads the keys it can guess and writes the
rendezvous state as a pickle that would create a file when unpickled
(tests/integration/store_attack.py). Before the per-attempt secret, the agent unpickled it within
seconds and the attempt was lost.

The run must then train on in its one attempt through three of the agent's keep-alives and end
when cancelled, the file must never appear, no guessed
key may be readable, and the secret must be in no place the other account can read. Not vacuous:
the attacker must have reached at least the two stores (the rendezvous store and the one the agent
shares with the ranks) as a TCPStore client and seen keys in them.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.integration.conftest import Product
from tests.integration.test_sockets import listeners
from trainer.process.store_secret import SECRET_VAR

pytestmark = pytest.mark.slow

ATTACK = Path(__file__).with_name("store_attack.py")
NOBODY = 65534
# torchrun's default keep-alive interval, at which its agent syncs the rendezvous state.
KEEP_ALIVE_S = 5.0
SYSTEM_PYTHON = Path(f"/usr/bin/python{sys.version_info.major}.{sys.version_info.minor}")


def as_nobody(argv: list[str], env: dict[str, str]) -> tuple[list[str], str]:
    """``argv`` (a Python program and its arguments) run as the unprivileged ``nobody``, and how.

    The account needs an interpreter and torch it may read. Plain ``runuser -u nobody`` with the
    system's Python of this version and this torch on PYTHONPATH where nobody can read them;
    where this checkout or the venv lies in a private folder (a CI clone under /root), nobody
    gets only CAP_DAC_READ_SEARCH on top (``setpriv``): it may then read files, which gives it
    no say over sockets, nor another user's /proc/PID/environ (that takes ptrace rights).
    """
    plain = ["runuser", "-u", "nobody", "--", str(SYSTEM_PYTHON)]
    if SYSTEM_PYTHON.exists() and subprocess.run([*plain, "-c", "import torch"], env=env,
                                                 capture_output=True, timeout=60).returncode == 0:
        return [*plain, *argv], "runuser -u nobody"
    reader = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
              "--inh-caps=+dac_read_search", "--ambient-caps=+dac_read_search", sys.executable]
    return [*reader, *argv], "setpriv nobody (+CAP_DAC_READ_SEARCH: this checkout is private)"


def rdzv_id_from_ps(procs: dict[int, tuple[str, str | None]]) -> str:
    for cmdline, _ in procs.values():
        for word in cmdline.split():
            if word.startswith("--rdzv-id="):
                return word.removeprefix("--rdzv-id=")
    raise AssertionError(f"no --rdzv-id in any command line of the run: {procs}")


def test_another_local_account_cannot_run_code_join_or_disturb_a_run(product: Product, tmp_path: Path) -> None:
    if os.geteuid() != 0 or shutil.which("runuser") is None or shutil.which("setpriv") is None:
        pytest.skip("acting as another local account needs root and util-linux's runuser/setpriv")
    # Paced steps, so the run trains through the attack and the agent's keep-alives after it.
    product.env["RUNYARD_FAULT_STEP_DELAY_S"] = "0.1"
    run_id = product.submit("train.max_steps=1000000", "train.log_every=1", "train.eval_every=1000000",
                            "name=store-attack")
    product.start_scheduler()
    product.wait_step(run_id, 2, timeout=120)

    procs, found = listeners(product)
    addresses = sorted({f"[{s.ip}]:{s.port}" if ":" in s.ip else f"{s.ip}:{s.port}" for s in found if s.kind == "tcp"})
    owners = {s.port: f"rank {s.local_rank}" if s.local_rank is not None else "agent/shim" for s in found}
    rdzv_id = rdzv_id_from_ps(procs)
    outside = tmp_path / "outside"
    outside.mkdir(mode=0o777)
    outside.chmod(0o777)
    payload = outside / "pwned"
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(outside),
           "PYTHONPATH": str(Path(torch.__file__).resolve().parents[1]), "PYTHONDONTWRITEBYTECODE": "1"}
    argv, how = as_nobody([str(ATTACK), "--addresses", ",".join(addresses), "--pids", ",".join(map(str, procs)),
                           "--rdzv-id", rdzv_id, "--payload-file", str(payload), "--secret-var", SECRET_VAR], env)
    attack = subprocess.run(argv, env=env, cwd=outside, capture_output=True, text=True, timeout=180)
    assert attack.returncode == 0, f"the attack program failed ({how}): {attack.stderr[-3000:]}"
    report = json.loads(attack.stdout.strip().splitlines()[-1])
    assert report["uid"] == NOBODY, report

    stores = [p for p in report["ports"] if p["store"] and (p["num_keys"] or 0) > 0]
    assert len(stores) >= 2, (f"the attack ({how}) did not reach both of the run's stores with keys in them "
                              f"(listeners {owners}): {report}")
    assert all(p["wrote"] for p in stores), f"the forged rendezvous state was not written: {report}"
    readable = {p["address"]: p["read"] for p in report["ports"] if p["read"]}
    assert not readable, f"another account read keys of the run by guessing their names: {readable}"
    assert not report["secret_seen"], f"another account could read the attempt's secret at {report['secret_seen']}"

    # torchrun's agent re-reads its rendezvous state at every keep-alive (5 s): before the secret
    # the forged state was unpickled within one. Three of them, watching for the harm meanwhile.
    step_after_attack = product.wait_step(run_id, 0)
    deadline = time.monotonic() + 3 * KEEP_ALIVE_S
    while time.monotonic() < deadline and not payload.exists():
        time.sleep(0.2)
    assert not payload.exists(), "the forged rendezvous state was unpickled: the attacker's command ran"
    attempts = product.query("SELECT number, status, cause, last_step FROM attempts WHERE run_id = :run", run=run_id)
    assert len(attempts) == 1 and attempts[0][1] == "RUNNING", f"the attack disturbed the run: {attempts}"
    assert attempts[0][3] > step_after_attack, f"the run stopped training after the attack: {attempts}"

    product.cli("cancel", str(run_id))
    detail = product.wait_status(run_id, "CANCELLED", "FAILED", "SUCCEEDED", timeout=120)
    assert detail["status"] == "CANCELLED", f"the attacked run did not end as asked: {json.dumps(detail)[:2000]}"
    assert not payload.exists()
