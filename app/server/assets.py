"""What the gate serves itself besides its own pages: the live charts' code and the Vega it draws
with (app/charts/live.py mounts the component that loads them), from app/assets. A few named files,
nothing else, each cached by the browser under an address that carries a hash of its contents."""

from __future__ import annotations

import functools
import hashlib
import json
from pathlib import Path

PATH = "/_runyard/vega/"  # where the gate serves them
ASSETS = Path(__file__).resolve().parents[1] / "assets"
VENDOR_DIR = ASSETS / "vega"  # vega 6.4.0, vega-lite 6.4.1, vega-interpreter 2.3.2: BSD-3-Clause (LICENSE there)
VENDOR_FILES = ("vega.min.js", "vega-lite.min.js", "vega-interpreter.js")
CODE = "live.js"  # the live chart component's code (app/assets/live.js)


def version(body: bytes) -> str:
    return hashlib.sha256(body).hexdigest()[:12]


def url(name: str) -> str:
    """The address of the file ``name``, with its version."""
    return f"{PATH}{name}?v={version(served(name) or b'')}"


@functools.cache
def served(name: str) -> bytes | None:
    """The file ``name`` under :data:`PATH`: one of Vega's, or the component's code told where
    Vega's are; None for any other name."""
    if name in VENDOR_FILES:
        return (VENDOR_DIR / name).read_bytes()
    if name != CODE:
        return None
    code = (ASSETS / CODE).read_text()
    return code.replace("__VENDOR_URLS__", json.dumps([url(f) for f in VENDOR_FILES])).encode()
