"""Verifying, loading and listing the checkpoints under one folder: a step counts only when its
folder matches its manifest (trainer/checkpoint/manager.py says how the folder is laid out); a
checkpoint that does not, or that ``torch.load(weights_only=True)`` refuses, is refused with its
reason and the next older one tried.

:class:`CheckpointReader` is a part of :class:`~trainer.checkpoint.manager.CheckpointManager`,
whose ``__init__`` sets the attributes it names; the manager is the class to use.
"""

from __future__ import annotations

import json
import logging
import os
import stat
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from db.vocabulary.layout import MANIFEST_FILE, STATE_FILE, STEP_DIR, UNSHARDED_FILE, step_dir_name
from trainer.checkpoint import sharded
from trainer.checkpoint.io import (
    CheckpointError,
    _sha256_file,
)

logger = logging.getLogger(__name__)

FORMAT_VERSION = 1  # a whole state in state.pt
SHARDED_FORMAT_VERSION = 2  # DCP's shards, .metadata and unsharded.pt


class CheckpointReader:
    """What every rank does with the checkpoints on disk (a part of ``CheckpointManager``)."""

    root: Path
    _on_refused: Callable[[int, str], None] | None

    def verified_steps(self) -> list[int]:
        """Return, ascending, the steps whose directory matches its manifest.

        This re-reads and hashes every checkpoint; ``load()`` hashes only what it needs.
        """
        return [step for step in self.stored_steps() if self.verify(step)[0]]

    def verify(self, step: int) -> tuple[bool, str]:
        """Check ``root/step-<step>`` against its manifest, re-reading and hashing every file.

        Returns:
            (True, "ok") or (False, reason), where reason is one of: "missing", "not a
            directory", "manifest missing", "manifest unreadable: ...", "manifest format_version
            X is not 1 or 2", "manifest step X != N", "<file>: missing", "<file>: not a regular file",
            "<file>: size A != B" (on disk != manifest), "<file>: sha256 mismatch",
            "<file>: unreadable: ...", "<file>: unlisted file"; for a sharded checkpoint also
            ".metadata: unreadable: ..." and where DCP's metadata and the manifest differ.
        """
        return self._verify(step, 0, 1)

    def _verify(self, step: int, share: int, shares: int) -> tuple[bool, str]:
        """:meth:`verify`, hashing only every ``shares``-th file from the ``share``-th on (in name
        order): the ranks of a sharded load split the hashing among them."""
        path = self.root / step_dir_name(step)
        if not path.exists() and not path.is_symlink():
            return False, "missing"
        if path.is_symlink() or not path.is_dir():
            return False, "not a directory"
        manifest, reason = self._read_manifest(path, step)
        if manifest is None:
            return False, reason
        files: dict[str, dict[str, Any]] = manifest["files"]
        for name in sorted(os.listdir(path)):
            if name != MANIFEST_FILE and name not in files:
                return False, f"{name}: unlisted file"
        for name, entry in files.items():  # every size before any hash: cheap failures first
            reason = _check_size(path / name, name, entry)
            if reason:
                return False, reason
        for name in sorted(files)[share::shares]:
            try:
                if _sha256_file(path / name) != files[name]["sha256"]:
                    return False, f"{name}: sha256 mismatch"
            except OSError as exc:
                return False, f"{name}: unreadable: {exc}"
        if manifest["format_version"] == SHARDED_FORMAT_VERSION:
            try:
                reason = sharded.check_metadata(sharded.read_metadata(path), manifest)
            except CheckpointError as exc:
                reason = str(exc)
            if reason:
                return False, reason
        return True, "ok"

    def load(self, step: int = -1, targets: Callable[[], Mapping[str, Any]] | None = None
             ) -> tuple[int, dict[str, Any]]:
        """Load a verified checkpoint.

        A requested step that fails verification is refused (``on_refused(step, reason)``)
        and the newest verified step below it is loaded instead; with ``step=-1`` the newest
        verified step is loaded, refusing each newer one that fails.

        Args:
            step: The step to load, or -1 for the newest verified one.
            targets: For a sharded checkpoint (collective then: every rank calls ``load``), what
                to load into: the state as it will be restored (the model's and optimizer's
                sharded state dicts, at the keys the checkpoint was saved with). Its tensors at
                the checkpoint's sharded places are loaded in place, resharded to this run's
                ranks; the checkpoint is refused, naming the tensor, when their shapes differ.

        Returns:
            (step, state) of the checkpoint loaded: tensors on CPU, except a sharded
            checkpoint's, which are the ``targets``' own.

        A checkpoint that verifies but cannot be loaded with ``weights_only=True`` (a manifest
        rewritten over a truncated file, a payload with a type the allow-list refuses) is refused
        the same way, and the next older one is tried.

        Raises:
            CheckpointError: No checkpoint at or below ``step`` both verifies and loads.
        """
        if step < -1:
            raise CheckpointError(f"step={step} must be >= 0, or -1 for the newest")
        candidates = sorted(self.stored_steps(), reverse=True)
        if step != -1:
            candidates = [s for s in candidates if s < step]
            candidates.insert(0, step)
        for candidate in candidates:
            if self._sharded(candidate):
                state, reason = self._load_sharded(candidate, targets)
                if state is not None:
                    return candidate, state
                ok = False
            else:
                ok, reason = self.verify(candidate)
            if ok:
                try:
                    return candidate, self._load_verified(candidate)
                except CheckpointError as exc:
                    # It matches its manifest yet cannot be loaded: a manifest rewritten over a
                    # truncated file, a payload weights_only refuses (or a torch upgrade dropped
                    # a type from its allow-list). As good as unverified: refuse it, go older.
                    reason = str(exc)
            logger.warning("checkpoint step-%d refused: %s", candidate, reason)
            if self._on_refused is not None:
                self._on_refused(candidate, reason)
        where = "" if step == -1 else f" at or below step {step}"
        raise CheckpointError(f"no verified checkpoint{where} in {self.root}")

    def _sharded(self, step: int) -> bool:
        """Whether ``step-<step>``'s manifest says it is sharded (one that cannot be read is not:
        every rank then refuses it on its own, with the same reason)."""
        manifest, _ = self._read_manifest(self.root / step_dir_name(step), step)
        return manifest is not None and manifest["format_version"] == SHARDED_FORMAT_VERSION

    def _load_sharded(self, step: int, targets: Callable[[], Mapping[str, Any]] | None
                      ) -> tuple[dict[str, Any] | None, str]:
        """Collective: verify ``step-<step>`` (the ranks share the hashing and agree on the verdict),
        check that its tensors fit ``targets``, then load them in place. Returns the state, or
        None and the reason it was refused (the same on every rank)."""
        import torch.distributed as dist  # noqa: PLC0415 - only for a sharded checkpoint

        group = sharded.checkpoint_group() if dist.is_initialized() else None
        if group is None:
            ok, reason = self.verify(step)
        else:
            verdicts: list[Any] = [None] * dist.get_world_size(group)
            dist.all_gather_object(verdicts, self._verify(step, dist.get_rank(group), len(verdicts)), group=group)
            ok, reason = next((v for v in verdicts if not v[0]), (True, "ok"))
        if not ok:
            return None, reason
        path = self.root / step_dir_name(step)
        manifest, _ = self._read_manifest(path, step)
        assert manifest is not None
        try:
            saved = torch.load(path / UNSHARDED_FILE, weights_only=True, map_location="cpu")
            rest, paths = saved["state"], saved["paths"]
        except Exception as exc:  # noqa: BLE001 - refused with its reason, as a whole state that will not load
            return None, (f"{path / UNSHARDED_FILE}: matches its manifest but cannot be loaded with weights_only=True: "
                          f"{_load_error_line(exc)}")
        wanted = sharded.tensors_at(targets() if targets is not None else {}, paths)
        reason = sharded.check_targets(manifest, wanted)
        if reason:
            return None, reason
        try:
            sharded.read_shards(path, wanted, group)
        except Exception as exc:  # noqa: BLE001 - DCP raises on every rank when one fails: all refuse it
            return None, f"loading the shards failed: {_load_error_line(exc)}"
        return sharded.put_back(rest, paths, wanted), ""

    def _load_verified(self, step: int) -> dict[str, Any]:
        path = self.root / step_dir_name(step) / STATE_FILE
        try:
            state: dict[str, Any] = torch.load(path, weights_only=True, map_location="cpu")
            return state
        except Exception as exc:
            raise CheckpointError(f"{path}: matches its manifest but cannot be loaded with weights_only=True: "
                                  f"{_load_error_line(exc)}") from exc

    def _read_manifest(self, path: Path, step: int) -> tuple[dict[str, Any] | None, str]:
        try:
            manifest = json.loads((path / MANIFEST_FILE).read_bytes())
        except FileNotFoundError:
            return None, "manifest missing"
        except (OSError, ValueError) as exc:
            return None, f"manifest unreadable: {exc}"
        if not isinstance(manifest, dict) or not isinstance(manifest.get("files"), dict):
            return None, "manifest unreadable: no 'files' table"
        version = manifest.get("format_version")
        if version not in (FORMAT_VERSION, SHARDED_FORMAT_VERSION):
            return None, f"manifest format_version {version!r} is not {FORMAT_VERSION} or {SHARDED_FORMAT_VERSION}"
        if manifest.get("step") != step:
            return None, f"manifest step {manifest.get('step')!r} != {step}"
        required = (STATE_FILE,) if version == FORMAT_VERSION else (UNSHARDED_FILE, ".metadata")
        for name in required:
            if name not in manifest["files"]:
                return None, f"manifest unreadable: {name} not listed"
        if version == SHARDED_FORMAT_VERSION and not isinstance(manifest.get("shards"), dict):
            return None, "manifest unreadable: no 'shards' table"
        for name, entry in manifest["files"].items():
            if name in ("", ".", "..", MANIFEST_FILE) or "/" in name or os.sep in name:
                return None, f"manifest unreadable: bad file name {name!r}"
            if not isinstance(entry, dict) or not isinstance(entry.get("bytes"), int) or not isinstance(
                entry.get("sha256"), str
            ):
                return None, f"manifest unreadable: bad entry for {name!r}"
        return manifest, ""

    def stored_steps(self) -> list[int]:
        """Steps that have a ``step-<N>`` folder, verified or not (nothing is read or hashed)."""
        try:
            names = os.listdir(self.root)
        except FileNotFoundError:
            return []
        return sorted(int(m.group(1)) for n in names if (m := STEP_DIR.fullmatch(n)))


def _load_error_line(exc: Exception) -> str:
    """The telling line of a failed ``torch.load``: the global ``weights_only`` refused, else the
    first line (torch's own messages run to a screenful of advice)."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    named = [ln for ln in lines if "GLOBAL" in ln or ln.startswith(("WeightsUnpickler error", "Unsupported"))]
    line = named[0] if named else (lines[0] if lines else type(exc).__name__)
    return f"{type(exc).__name__}: {line}"[:400]


def _check_size(path: Path, name: str, entry: Mapping[str, Any]) -> str:
    try:
        st = path.lstat()
    except FileNotFoundError:
        return f"{name}: missing"
    if not stat.S_ISREG(st.st_mode):
        return f"{name}: not a regular file"
    if st.st_size != entry["bytes"]:
        return f"{name}: size {st.st_size} != {entry['bytes']}"
    return ""

