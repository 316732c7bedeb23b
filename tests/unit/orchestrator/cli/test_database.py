"""The database verbs (orchestrator/cli/database.py): `runyard db upgrade` twice changes nothing."""

from __future__ import annotations

from click.testing import CliRunner

from db.vocabulary.settings import Settings
from orchestrator.cli.group import cli


def run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, list(args))
    return result.exit_code, result.stdout, result.stderr


def test_db_upgrade_is_idempotent(settings: Settings) -> None:
    assert run("db", "upgrade")[0] == 0
    assert run("db", "upgrade")[0] == 0
