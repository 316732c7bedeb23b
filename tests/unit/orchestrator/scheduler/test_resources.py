"""The machine inventory (orchestrator/scheduler/resources.py): each GPU's UUID read through NVML
(bytes or str, as the versions of nvidia-ml-py answer) and carried with the inventory the
heartbeat publishes.
"""

from __future__ import annotations

import json
import sys
import types

import pytest

from db.vocabulary.inventory import Inventory
from orchestrator.scheduler.resources import detect_inventory

UUIDS = ("GPU-00000000-aaaa-0000-0000-000000000000", "GPU-11111111-bbbb-1111-1111-111111111111",
         "GPU-22222222-cccc-2222-2222-222222222222")


def test_the_scheduler_publishes_each_gpus_uuid_with_its_inventory(monkeypatch: pytest.MonkeyPatch) -> None:
    """NVML is mocked (no GPU on the machines that run these tests); older nvidia-ml-py versions
    answer bytes, newer ones str."""
    nvml = types.ModuleType("pynvml")
    nvml.nvmlInit = nvml.nvmlShutdown = lambda: None  # type: ignore[attr-defined]
    nvml.nvmlDeviceGetCount = lambda: 2  # type: ignore[attr-defined]
    nvml.nvmlDeviceGetHandleByIndex = lambda i: i  # type: ignore[attr-defined]
    nvml.nvmlDeviceGetName = lambda i: "NVIDIA H100 80GB HBM3"  # type: ignore[attr-defined]
    nvml.nvmlDeviceGetMemoryInfo = lambda i: types.SimpleNamespace(total=80 * 2**30)  # type: ignore[attr-defined]
    nvml.nvmlDeviceGetUUID = lambda i: UUIDS[i].encode() if i else UUIDS[i]  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    inventory = detect_inventory({})
    assert inventory.gpu_uuids == UUIDS[:2]
    assert Inventory.from_json(json.loads(json.dumps(inventory.to_json()))) == inventory  # as the heartbeat carries it
    older = {k: v for k, v in inventory.to_json().items() if k != "gpu_uuids"}  # an older scheduler's record
    assert Inventory.from_json(older).gpu_uuids == ()
