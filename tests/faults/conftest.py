"""The fault suite: each case a hostile tester found, reproduced with real torchrun ranks, and
what must hold instead. Fixtures shared with the integration tests (a real runyard install in
tmp_path, its CLI and scheduler as subprocesses)."""

from __future__ import annotations

from tests.integration.conftest import Product, product, running_product  # noqa: F401
