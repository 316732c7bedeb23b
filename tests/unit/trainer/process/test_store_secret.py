"""The per-attempt secret of a run's stores and the rendezvous state's unpickler
(trainer/process/store_secret.py); the attack itself runs in tests/integration/test_store_attack.py."""

from __future__ import annotations

import datetime
import importlib
import os
import pickle
from datetime import timedelta
from pathlib import Path

import pytest
from torch.distributed import TCPStore
from torch.distributed.elastic.rendezvous import dynamic_rendezvous
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import _NodeDesc, _RendezvousState

from trainer.process import store_secret
from trainer.process.store_secret import SECRET_VAR, MissingSecret

dist_rendezvous = importlib.import_module("torch.distributed.rendezvous")  # the attribute is a function


class Payload:
    def __init__(self, path: Path):
        self.path = path

    def __reduce__(self) -> tuple:
        return os.system, (f"touch {self.path}",)


def test_a_real_rendezvous_state_loads_and_a_forged_one_runs_nothing(tmp_path: Path) -> None:
    state = _RendezvousState()
    node = _NodeDesc("127.0.0.1", 4242, 0)
    state.participants[node] = 0
    state.wait_list.add(node)
    state.last_heartbeats[node] = datetime.datetime.now(datetime.timezone.utc)
    state.deadline = datetime.datetime.now(datetime.timezone.utc) + timedelta(seconds=30)
    loaded = store_secret.load_rendezvous_state(pickle.dumps(state))
    assert loaded.participants == {node: 0} and loaded.deadline == state.deadline

    marker = tmp_path / "ran"
    with pytest.raises(pickle.UnpicklingError, match=r"posix\.system|os\.system"):
        store_secret.load_rendezvous_state(pickle.dumps(Payload(marker)))
    assert not marker.exists()


def test_torchrun_reads_its_rendezvous_state_through_the_guarded_unpickler(tmp_path: Path) -> None:
    original = dynamic_rendezvous.pickle
    try:
        store_secret.guard_rendezvous_unpickling()
        with pytest.raises(pickle.PickleError):  # what torchrun catches as a corrupt state
            dynamic_rendezvous.pickle.loads(pickle.dumps(Payload(tmp_path / "ran")))
        assert not (tmp_path / "ran").exists()
    finally:
        dynamic_rendezvous.pickle = original


def test_a_rank_joins_the_agents_store_under_the_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    server = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=5))
    secret = store_secret.new_secret()
    monkeypatch.setenv(SECRET_VAR, secret)
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "True")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "0")
    monkeypatch.setattr(dist_rendezvous, "_create_c10d_store", dist_rendezvous._create_c10d_store)
    assert store_secret.guard_worker_store()
    assert store_secret.guard_worker_store()  # twice: wrapped once
    store = dist_rendezvous._create_c10d_store("127.0.0.1", server.port, 0, 1, timedelta(seconds=5))
    store.set("default_pg/0//0", b"address")
    # The secret is part of every key's name: nobody without it can name the key.
    assert server.check([f"runyard/{secret}/default_pg/0//0"])
    assert not server.check(["default_pg/0//0"])


def test_without_a_secret_a_rank_is_left_as_torch_made_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(SECRET_VAR, raising=False)
    before = dist_rendezvous._create_c10d_store
    assert not store_secret.guard_worker_store()
    assert dist_rendezvous._create_c10d_store is before


def test_one_node_makes_its_own_secret_several_nodes_must_share_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SECRET_VAR, "")  # so that the one made below is removed after the test
    monkeypatch.delenv(SECRET_VAR)
    with pytest.raises(MissingSecret, match=f"{SECRET_VAR} must be set .* 2 nodes"):
        store_secret.ensure_secret(2)
    made = store_secret.ensure_secret(1)
    assert len(made) == 64 and os.environ[SECRET_VAR] == made  # the agent's ranks inherit it
    assert store_secret.ensure_secret(2) == made


def test_every_attempt_gets_a_new_secret() -> None:
    assert len({store_secret.new_secret() for _ in range(100)}) == 100
