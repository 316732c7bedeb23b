"""Sharded (FSDP2) checkpoints through DCP on real gloo ranks: every rank writes its own shard,
rank 0 never holds the whole state; a checkpoint saved on 4 ranks loads on 2 and one saved on 2
loads on 4, model and optimizer bit for bit, and training goes on with the same losses; each kind
of damage to one shard, to DCP's metadata or to the manifest is refused by name and the previous
checkpoint loaded; a checkpoint of another model's shapes is refused naming the tensor; a crafted
``.metadata`` pickle is refused without running its code.

The product-level runs (an FSDP gpt-char run killed and resumed, forked to another number of
ranks) are in tests/integration/test_gpt_char.py.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import fork_ranks
from tests.integration import sharded_worker

pytestmark = pytest.mark.slow
# The 4-rank save of `saved` is made once, on one worker (tests/conftest.py).
SHARES_ITS_MODULE_FIXTURES = True


def run(folder: Path, world: int, scenario: str) -> dict[str, Any]:
    fork_ranks(sharded_worker.main, (world, str(folder), scenario), world)  # one import for the 10 ranks
    result: dict[str, Any] = json.loads((folder / f"{scenario}.json").read_text())
    return result


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    folder = tmp_path_factory.mktemp("sharded")
    return folder, run(folder, 4, "save4")


def test_four_ranks_write_their_own_shards_and_a_manifest_that_lists_them(saved: tuple[Path, dict[str, Any]]) -> None:
    _, out = saved
    assert out["files"] == [".metadata", "__0_0.distcp", "__1_0.distcp", "__2_0.distcp", "__3_0.distcp",
                            "manifest.json", "unsharded.pt"]
    manifest = out["manifest"]
    assert manifest["format_version"] == 2 and manifest["format"] == "dcp" and manifest["world_size"] == 4
    assert set(manifest["files"]) == set(out["files"]) - {"manifest.json"}
    # Each rank's file holds a quarter of the weights and optimizer moments, no more: nothing is
    # gathered to rank 0 (unsharded.pt holds only the step counters, hyper-parameters and paths).
    shards = [manifest["files"][f"__{r}_0.distcp"]["bytes"] for r in range(4)]
    assert max(shards) < 1.3 * min(shards)
    assert manifest["files"]["unsharded.pt"]["bytes"] < min(shards) / 4
    assert manifest["shards"]["model.wte.weight"] == {"shape": [17, 24], "dtype": "float32"}
    assert manifest["shards"]["optimizer.state.wte.weight.exp_avg"] == {"shape": [17, 24], "dtype": "float32"}
    digests = {step: entry["digest"] for step, entry in out["saved"].items()}
    assert len(set(digests.values())) == 3  # the weights changed between saves


def test_saved_on_4_loads_on_2_and_saved_on_2_loads_on_4_bit_for_bit(saved: tuple[Path, dict[str, Any]]) -> None:
    folder, four = saved
    on_two = run(folder, 2, "load-on-2")
    assert on_two["loaded"] == 3 and on_two["differences"] == []
    on_four = run(folder, 4, "load-on-4")
    assert on_four["loaded"] == 3 and on_four["differences"] == []
    # Training goes on from the same state: the same losses as the uninterrupted 4-rank run, up to
    # the order of the gradient reduction.
    for losses in (on_two["losses"], on_four["losses"]):
        assert all(math.isclose(a, b, rel_tol=1e-5) for a, b in zip(losses, four["losses"], strict=True))
    assert on_four["losses"] == four["losses"]  # the same 4 ranks: bit for bit


def test_damaged_shards_metadata_and_manifest_are_refused_by_name_with_fallback(
        saved: tuple[Path, dict[str, Any]]) -> None:
    _, out = saved  # the damage cases ran right after the saves, in the same 4 ranks
    cases = out["cases"]
    expected = {
        "truncated": "__1_0.distcp: size",
        "flipped": "__2_0.distcp: sha256 mismatch",
        "missing": "__3_0.distcp: missing",
        "evil-metadata": "posix.system is not part of a checkpoint's metadata",
        "manifest-shapes": "the manifest",
    }
    for case, reason in expected.items():
        assert cases[case]["loaded"] == 2, case  # the previous checkpoint, whole and verified
        assert cases[case]["same"], case
        [(step, said)] = cases[case]["refused"]
        assert step == 3 and reason in said, (case, said)
    assert not out["evil_ran"]
    other = cases["other-model"]
    assert "no verified checkpoint" in other["error"]
    assert [step for step, _ in other["refused"]] == [3, 2, 1]
    assert all(said == ("model.blocks.0.attn.proj.weight: the checkpoint's is float32 [24, 24], this run's "
                        "float32 [32, 32] (a checkpoint of another model)") for _, said in other["refused"])
