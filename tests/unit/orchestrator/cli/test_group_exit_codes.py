"""docs/CLI.md's exit codes, verb by verb: every refusal of a bad value (an option, an argument, a
config) exits 2 with one `error:` line naming it, and the run, the data folder or the database
that cannot be used exits 1 (issue 52, item 12). The table walks each verb's bad values; a verb
that takes no value of its own to refuse (only RUN, or flags) is listed as such, and a test
keeps the two lists covering every verb there is, so that a new verb must say where it stands.

In this process (tests/cli_runner.py) but for `ui` and `up`, which serve and so run as processes
(their refusals come before anything starts).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import click
import pytest
from sqlalchemy.orm import Session, sessionmaker

from db.models import Attempt, Checkpoint
from db.states import RunStatus, transition
from db.vocabulary.settings import Settings
from orchestrator.cli.group import cli
from tests.cli_runner import needs_a_process, run_in_process
from tests.unit.paths import ROOT

EXAMPLE = str(ROOT / "examples" / "digits.toml")
SWEEP = str(ROOT / "examples" / "sweep.toml")  # sweep 1 of the home fixture: RUNNING, no trial made yet
# Run 1 is QUEUED; run 2 SUCCEEDED with 2 ranks, attempt 1 and a checkpoint at step 100; channel
# 1 exists (see the home fixture).
QUEUED, DONE = "1", "2"

# args (given the scratch folder), expected code, text the error line must hold
Case = tuple[Callable[[Path], list[str]], int, str]


def _args(*args: str) -> Callable[[Path], list[str]]:
    return lambda _tmp: list(args)


def _not_an_export(tmp: Path) -> list[str]:
    (tmp / "notes.txt").write_text("not an export\n")
    return ["db", "import", str(tmp / "notes.txt")]


BAD_VALUES: list[Case] = [
    # alerts: every URL refusal, a trigger, a secret, a channel id, each default
    (_args("alerts", "add", "json://2852039166/"), 2, "2852039166 is 169.254.169.254, a cloud metadata address"),
    (_args("alerts", "add", "nosuchscheme://x"), 2, "Apprise does not understand it"),
    (_args("alerts", "add", "hooks.example.com/x"), 2, "no scheme"),
    (_args("alerts", "add", "runyard+https:///hook"), 2, "no host"),
    (_args("alerts", "add", "runyard+https://[::1/hook"), 2, "Invalid IPv6 URL"),
    (_args("alerts", "add", "json://hooks.example.com/x", "--secret", "s" * 20), 2, "--secret is for runyard+https"),
    (_args("alerts", "add", "runyard+https://hooks.example.com/x", "--secret", "abc"), 2, "at least 16"),
    (_args("alerts", "add", "json://hooks.example.com/x", "--on", "nope"), 2, "'nope'"),
    (_args("alerts", "rm", "99"), 2, "channel 99 does not exist"),
    (_args("alerts", "test", "99"), 2, "channel 99 does not exist"),
    (_args("alerts", "history", "--limit", "0"), 2, "--limit"),
    (_args("alerts", "defaults", "--triggers", "nope"), 2, "triggers: 'nope': not a trigger"),
    (_args("alerts", "defaults", "--urgent", "nope"), 2, "urgent: 'nope': not a trigger"),
    (_args("alerts", "defaults", "--quiet-hours", "25:00-07:00"), 2, "quiet_hours = '25:00-07:00'"),
    (_args("alerts", "defaults", "--ui-url", "runyard.lan"), 2, "ui_url = 'runyard.lan'"),
    (_args("alerts", "defaults", "--repeat-s", "-1"), 2, "--repeat-s"),
    # settings: an unknown key, a value that is not a number, one out of range
    (_args("settings", "set", "cost.tarif=0.3"), 2, "cost.tarif: no such key"),
    (_args("settings", "set", "cost.pue=high"), 2, "cost.pue = 'high': not a number"),
    (_args("settings", "set", "cost.busy_hours_per_year=9000"), 2, "cost.busy_hours_per_year = 9000"),
    # edit: every refusal of --name, --add-tag, --remove-tag, --note
    (_args("edit", QUEUED), 2, "say what to change"),
    (_args("edit", QUEUED, "--name", "two words"), 2, "name 'two words': use letters"),
    (_args("edit", QUEUED, "--name", "x" * 101), 2, "at most 100 characters"),
    (_args("edit", QUEUED, "--name", "ends-in-a-line-break\n"), 2, "name 'ends-in-a-line-break\\n'"),
    (_args("edit", QUEUED, "--add-tag", "<b>tag</b>"), 2, "tag '<b>tag</b>': use letters"),
    (_args("edit", QUEUED, "--add-tag", "t" * 41), 2, "at most 40 characters"),
    (_args("edit", QUEUED, *[x for i in range(21) for x in ("--add-tag", f"t{i}")]), 2, "at most 20"),
    (_args("edit", QUEUED, "--remove-tag", "nope"), 2, "remove tag 'nope'"),
    (_args("edit", QUEUED, "--add-tag", "a", "--remove-tag", "a"), 2, "both added and removed"),
    (_args("edit", QUEUED, "--note", "n" * 4001), 2, "note: 4001 characters"),
    (_args("edit", QUEUED, "--note", "a\x00b"), 2, "control character(s) U+0000"),
    # logs, ls
    (_args("logs", DONE, "--rank", "9"), 2, "--rank 9: run 2 has ranks 0 to 1"),
    (_args("logs", DONE, "--attempt", "7"), 2, "--attempt 7: run 2 has attempts 1 to 1"),
    (_args("logs", DONE, "--attempt", "0"), 2, "--attempt"),
    (_args("ls", "--status", "bogus"), 2, "--status 'bogus' is not a run status"),
    (_args("ls", "--sort", "bogus"), 2, "--sort"),
    # resume, fork, pin: a step or checkpoint the run does not have
    (_args("resume", DONE, "--step", "7"), 2, "--step 7: run 2 has no checkpoint at that step; its checkpoints' "
                                              "steps: 100"),
    (_args("resume", DONE, "--checkpoint", "99"), 2, "--checkpoint 99: run 2 has no checkpoint 99"),
    (_args("resume", DONE, "--step", "-1"), 2, "--step"),
    (_args("fork", DONE, "--step", "7"), 2, "--step 7: run 2 has no checkpoint at that step"),
    (_args("fork", DONE, "--checkpoint", "99"), 2, "--checkpoint 99"),
    (_args("fork", DONE, "--set", "train.lr=fast"), 2, "train.lr = 'fast'"),
    (_args("pin", DONE), 2, "name the checkpoint: --step N or --checkpoint ID"),
    (_args("pin", DONE, "--step", "7"), 2, "--step 7: run 2 has no checkpoint at that step"),
    (_args("pin", DONE, "--checkpoint", "99"), 2, "--checkpoint 99"),
    # rm without an answer (a script must say --yes)
    (_args("rm", DONE), 2, "nothing deleted: no answer"),
    # submit: the config, its tags and its alert channels
    (_args("submit", EXAMPLE, "--set", "train.lr=fast"), 2, "train.lr = 'fast'"),
    (_args("submit", EXAMPLE, "--set", 'tags=["<b>tag</b>"]'), 2, "tag '<b>tag</b>'"),
    (_args("submit", EXAMPLE, "--set", 'alerts.channels=["99"]'), 2, "no channel 99; the channels: 1: json://"),
    # import, db
    (lambda tmp: ["import", "tensorboard", str(tmp / "nowhere")], 2, "no such folder"),
    (lambda tmp: ["db", "export", str(tmp)], 2, "is a directory"),
    (_not_an_export, 2, "is not a runyard export"),
    # sweep: the file (the base, the section, the two together), the limits, a trial's number
    (_args("sweep", "start", SWEEP, "--set", 'sweep.space."train.lr"={log_uniform=[0.0, 1.0]}'), 2,
     'sweep.space."train.lr": log_uniform = [0.0, 1.0]: a log range needs both bounds above 0'),
    (_args("sweep", "start", SWEEP, "--set", "sweep.metric=val_loss"), 2, "sweep.metric = 'val_loss'"),
    (_args("sweep", "start", EXAMPLE), 2, "the file has no [sweep] section"),
    (_args("sweep", "preview", SWEEP, "--set", 'sweep.space."train.nope"={int=[1, 2]}'), 2,
     "train.nope is not a key of the base config"),
    (_args("sweep", "edit", "1"), 2, "say what to change: --max-trials or --max-concurrent"),
    (_args("sweep", "edit", "1", "--max-concurrent", "0"), 2, "--max-concurrent"),
    (_args("sweep", "promote", "1", "first"), 2, "TRIAL"),
    (_args("submit", SWEEP), 2, "this file is a sweep (it has a [sweep] section): start it with `runyard sweep start"),
    # the serving verbs refuse a bad combination before they start (processes)
    (_args("ui", "--host", "0.0.0.0", "--auth", "none"), 2, "--no-auth is refused with --host 0.0.0.0"),
    (_args("up", "--port", "0"), 2, "--port"),
]

# Verbs whose only inputs are a RUN (a run that cannot be used exits 1), flags, or nothing.
NO_VALUES = frozenset({"alerts ls", "archive", "cancel", "config-reference", "db upgrade", "info", "metrics", "pause",
                       "rerun", "scheduler", "show", "stacks", "star", "token", "sweep ls", "sweep show",
                       "sweep pause", "sweep resume", "sweep cancel", "sweep best", "settings show"})

# What stays 1: the run, the data folder or the database cannot be used as asked.
RUNTIME: list[Case] = [
    (_args("show", "99"), 1, "no run with id 99"),
    (_args("resume", QUEUED), 1, "cancel it first"),
    (_args("archive", QUEUED), 1, "only a finished run can be archived"),
    (_args("rm", QUEUED, "--yes"), 1, "cancel it first"),
    (_args("logs", QUEUED), 1, "has no attempts yet"),
    (_args("sweep", "show", "99"), 1, "no sweep with id 99"),
    (_args("sweep", "promote", "1", "0"), 1, "sweep 1 has no trial 0"),
    (_args("sweep", "resume", "1"), 1, "sweep 1 is RUNNING: only a PAUSED sweep can be resumed"),
    (_args("sweep", "best", "1"), 1, "sweep 1 has no trial with a value of eval_loss yet"),
]


def _verbs() -> list[str]:
    ctx = click.Context(cli)
    found: list[str] = []

    def walk(group: click.Group, prefix: list[str]) -> None:
        for name in group.list_commands(ctx):
            command = group.get_command(ctx, name)
            if isinstance(command, click.Group):
                walk(command, [*prefix, name])
            elif command is not None:
                found.append(" ".join([*prefix, name]))

    walk(cli, [])
    return found


def _verb_of(args: list[str], verbs: list[str]) -> str:
    return max((v for v in verbs if args[:len(v.split())] == v.split()), key=len)


@pytest.fixture
def home(settings: Settings, sessions: sessionmaker[Session]) -> dict[str, str]:
    env = {**os.environ, "RUNYARD_HOME": str(settings.home), "RUNYARD_DB_URL": settings.db_url,
           "RUNYARD_CPU_SLOTS": "2", "PYTHONPATH": str(ROOT)}
    for _ in range(2):
        assert run_in_process(["submit", EXAMPLE], env).returncode == 0
    assert run_in_process(["alerts", "add", "json://hooks.example.com/hook"], env).returncode == 0
    assert run_in_process(["sweep", "start", SWEEP], env).stdout.strip() == "1"
    now = time.time()
    with sessions() as s:
        for status in (RunStatus.STARTING, RunStatus.RUNNING, RunStatus.SUCCEEDED):
            assert transition(s, int(DONE), status, "test")
        s.add(Attempt(run_id=int(DONE), number=1, status="SUCCEEDED", dir=str(settings.home / "a1"),
                      started_at=now - 60, ended_at=now))
        s.add(Checkpoint(run_id=int(DONE), attempt=1, step=100, path="/c/step-100", bytes=10, sha256="0",
                         params_digest="0", blocked_s=0.1, total_s=0.1, created_at=now - 30))
        s.commit()
    return env


def _run(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    if not needs_a_process(args):
        return run_in_process(args, env)
    return subprocess.run([sys.executable, "-m", "orchestrator", *args], env=env, capture_output=True, text=True,
                          timeout=120, check=False, stdin=subprocess.DEVNULL)


def test_every_verb_is_in_the_table_or_takes_no_value() -> None:
    verbs = _verbs()
    tabled = {_verb_of(case(Path("/tmp")), verbs) for case, _, _ in BAD_VALUES if case is not _not_an_export}
    tabled.add("db import")
    missing = sorted(set(verbs) - tabled - NO_VALUES)
    assert not missing, f"add each verb's bad values to BAD_VALUES (or it to NO_VALUES, saying why): {missing}"
    assert not NO_VALUES - set(verbs), "NO_VALUES names a verb that is gone"


def test_a_bad_value_exits_2_and_a_run_that_cannot_be_used_exits_1(home: dict[str, str], tmp_path: Path) -> None:
    wrong = []
    for case, code, text in BAD_VALUES + RUNTIME:
        args = case(tmp_path)
        result = _run(args, home)
        said = result.stderr.startswith(("error: ", "Usage: ")) and text in result.stderr
        if result.returncode != code or not said or "Traceback" in result.stderr:
            wrong.append(f"runyard {' '.join(a[:40] for a in args)[:160]}: exit {result.returncode} (want {code}), "
                         f"stderr {result.stderr.strip()[-300:]!r}")
    assert not wrong, "\n".join(wrong)
    listed = run_in_process(["ls", "--json"], home)
    assert listed.stdout.count('"id"') == 2  # no refused submit or fork queued a run
