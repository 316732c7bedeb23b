"""``import runyard`` (runyard.py): the SDK under a name that cannot clash with a script's own
``trainer.py`` or ``db.py``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.unit.import_graph import import_graph

ROOT = Path(__file__).resolve().parents[2]

# A script that keeps its own trainer.py beside it (as minGPT does) and uses runyard's SDK.
SCRIPT = """
import sys
import trainer                      # the script's own file
assert trainer.MINE == "user", trainer
import runyard
assert runyard.Run.__module__ == "trainer.sdk" and callable(runyard.init)
assert runyard.Run.__init__.__code__.co_filename.startswith({root!r}), runyard.Run
import trainer as again             # still the script's own, after the SDK loaded
assert again.MINE == "user" and sys.modules["trainer"].MINE == "user"
print("ok")
"""

# The same with the SDK first: the user's trainer.py is imported after runyard's SDK loaded.
SCRIPT_SDK_FIRST = """
import runyard
run_class = runyard.Run
import trainer
assert trainer.MINE == "user", trainer
assert run_class.__module__ == "trainer.sdk"
print("ok")
"""


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT)}


def _script_folder(tmp_path: Path, text: str) -> Path:
    (tmp_path / "trainer.py").write_text('MINE = "user"\nclass Trainer: ...\n')
    script = tmp_path / "train.py"
    script.write_text(text.format(root=str(ROOT)))
    return script


def test_import_runyard_is_cheap_and_lazy() -> None:
    code = ("import sys, runyard; assert 'torch' not in sys.modules; "
            "run = runyard.Run; import trainer.sdk; "
            "assert run is trainer.sdk.Run and runyard.init is trainer.sdk.init; "
            "import trainer; assert trainer.Run is run; print('ok')")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=_env(), capture_output=True, text=True)
    assert out.stdout.strip() == "ok", out.stderr


@pytest.mark.parametrize("text", [SCRIPT, SCRIPT_SDK_FIRST], ids=["trainer-first", "runyard-first"])
@pytest.mark.parametrize("runner", ["script_runner", "python"])
def test_a_scripts_own_trainer_py_does_not_shadow_the_sdk(tmp_path: Path, text: str, runner: str) -> None:
    script = _script_folder(tmp_path, text)
    # Under runyard, ranks run `python -m trainer.process.script_runner SCRIPT` (the script's folder
    # first on sys.path); alone, `python SCRIPT` does the same.
    command = ([sys.executable, "-m", "trainer.process.script_runner", str(script)] if runner == "script_runner"
               else [sys.executable, str(script)])
    out = subprocess.run(command, cwd=ROOT, env=_env(), capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_the_sdk_loads_every_module_it_will_ever_import_while_its_packages_hold_their_names() -> None:
    """runyard.py imports the SDK's whole closure up front (it then gives the names ``trainer``
    and ``db`` back to a script's own files), so the list must be the closure read from the
    source, function-level imports included."""
    import runyard  # noqa: PLC0415 - importing the SDK rearranges sys.modules: in this test only

    graph = import_graph()
    closure: set[str] = set()
    todo = ["trainer.sdk"]
    while todo:
        module = todo.pop()
        if module not in closure:
            closure.add(module)
            todo.extend(graph.get(module, ()))
    assert set(runyard._SDK_MODULES) == closure
    assert {m.split(".")[0] for m in closure} <= set(runyard._PACKAGES)


def test_a_scripts_own_db_py_does_not_shadow_the_sdk_nor_the_sdk_it(tmp_path: Path) -> None:
    """The same for ``db``: the SDK's modules import runyard's db package, the script its db.py."""
    (tmp_path / "db.py").write_text('MINE = "user"\n')
    script = tmp_path / "train.py"
    script.write_text("import db\nassert db.MINE == 'user'\nimport runyard\nrun = runyard.Run\n"
                      "import db as again\nassert again.MINE == 'user' and again is db\n"
                      f"assert sys.modules['db.vocabulary.config'].__file__.startswith({str(ROOT)!r})\nprint('ok')\n"
                      .replace("import db\n", "import sys\nimport db\n", 1))
    out = subprocess.run([sys.executable, "-m", "trainer.process.script_runner", str(script)], cwd=ROOT, env=_env(),
                         capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
