"""The checkpoint manifest: the SHA-256 and size of every file that decides what a checkpoint computes (its
weights, its ``config.json`` and its training state), so a load proves them whole and unchanged.

Safetensors and torch files carry no checksum: a flipped bit in tensor data loads as a different model, and an
edited ``config.json`` (``num_heads`` 4 -> 8 keeps every weight shape; a normalisation std) loads as another model
or another input pipeline. Each save records ``manifest.json`` beside the files::

    {"format": "vitlab-manifest/1",
     "files": {"model.safetensors": {"sha256": "...", "bytes": 123}, "config.json": {...}, "state.pt": {...}},
     "previous": {...}}

A save is two-phase, because its files are replaced one by one and a kill may fall between two of them:

1. the manifest is rewritten with the new entries under ``files`` and the entries of the files now on disk under
   ``previous`` (a save is under way: each file is its new or its previous version, both whole);
2. the files are replaced (each atomically, :mod:`vitlab.atomic`);
3. the manifest is rewritten without ``previous``.

Loading a listed file checks its size and SHA-256 against ``files`` (or ``previous`` while a save was cut short) and
refuses any other content in one line naming the file; ``verify=False`` (``--no-verify``) is the explicit way
out for a file changed on purpose. The values of ``config.json`` are validated on every load all the same
(:func:`vitlab.checkpoint.files.read_config`). A folder without a manifest (timm or other weights) loads
unchecked. A manifest of an older vitlab, which did not list ``config.json``, still checks the weights and the
state; its ``config.json`` loads with one :class:`CheckpointWarning` saying it is not checked, and the next save of
the run (``--resume``) records it.
"""

from __future__ import annotations

import hashlib
import json
import warnings
from pathlib import Path
from typing import Any

from vitlab import atomic
from vitlab.checkpoint.textfiles import read_json
from vitlab.errors import CheckpointError

MANIFEST = "manifest.json"
MANIFEST_FORMAT = "vitlab-manifest/1"
NO_VERIFY = "pass --no-verify (verify=False) only if you changed it on purpose"

Entry = dict[str, Any]  # {"sha256": hex digest, "bytes": size}


class CheckpointWarning(UserWarning):
    """A checkpoint file loads, but is not checked (a manifest of an older vitlab that does not list it)."""


def entry_of(data: bytes) -> Entry:
    return {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}


def file_entry(path: Path) -> Entry:
    """The entry of the file at ``path``, read in 1 MiB chunks."""
    digest, size = hashlib.sha256(), 0
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 20):
            digest.update(chunk)
            size += len(chunk)
    return {"sha256": digest.hexdigest(), "bytes": size}


def read_manifest(folder: Path) -> dict[str, Any] | None:
    """The manifest of ``folder``, None when there is none, a :class:`CheckpointError` when it is damaged."""
    path = folder / MANIFEST
    if not path.is_file():
        return None
    try:
        manifest = read_json(path, fix="", error=CheckpointError)
    except CheckpointError as exc:
        raise CheckpointError(f"{path} is damaged ({exc.problem}), so the checkpoint cannot be checked; restore the "
                              f"folder from a good copy, or {NO_VERIFY}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != MANIFEST_FORMAT or not isinstance(
            manifest.get("files"), dict):
        raise CheckpointError(f"{path} is not a {MANIFEST_FORMAT} manifest; restore the folder from a good copy, or "
                              f"{NO_VERIFY}")
    return manifest


def _accepted(manifest: dict[str, Any], name: str) -> list[Entry]:
    accepted = [manifest["files"][name]] if name in manifest["files"] else []
    previous = manifest.get("previous") or {}
    if name in previous:
        accepted.append(previous[name])
    return [e for e in accepted if isinstance(e, dict)]


def verify(path: Path, *, expected: bool = False) -> None:
    """Refuse ``path`` when its folder's manifest lists it with another size or SHA-256 (no manifest: no check).
    ``expected``: every vitlab save lists this file now (``config.json``), so a manifest without it is an older
    vitlab's, and the file loads with a :class:`CheckpointWarning` that it is not checked."""
    manifest = read_manifest(path.parent)
    if manifest is None:
        return
    accepted = _accepted(manifest, path.name)
    if not accepted:
        if expected:
            warnings.warn(f"{path} is not in {path.parent / MANIFEST}, so it is not checked (an older vitlab saved "
                          "the run); its values are validated, and the next save of the run (--resume) records it",
                          CheckpointWarning, stacklevel=3)
        return
    size = path.stat().st_size
    if any(e.get("bytes") == size for e in accepted) and file_entry(path) in accepted:
        return
    raise CheckpointError(f"{path} does not match the SHA-256 recorded in {path.parent / MANIFEST} when it was "
                          f"saved ({size} bytes, {accepted[0].get('bytes')} recorded): it was edited, or damaged on "
                          f"disk or in a copy; restore it from a good copy, or {NO_VERIFY}")


def _on_disk(folder: Path, names: tuple[str, ...]) -> dict[str, Entry]:
    """The entries of the listed files in ``folder`` as they are now, trusting a committed manifest."""
    try:
        manifest = read_manifest(folder)
    except CheckpointError:
        manifest = None
    if manifest is not None and not manifest.get("previous"):
        return {k: v for k, v in manifest["files"].items() if k in names}
    entries = {}
    for name in names:  # no manifest, or a save was cut short: see which version each file is
        path = folder / name
        if not path.is_file():
            continue
        found = file_entry(path)
        if manifest is None or found in _accepted(manifest, name):
            entries[name] = found
    return entries


def begin(folder: Path, new: dict[str, Entry], names: tuple[str, ...]) -> dict[str, Entry]:
    """Phase 1 of a save of ``new`` (name -> entry); returns the entries to :func:`commit` once they are written."""
    current = _on_disk(folder, names)
    files = {**current, **new}
    _write(folder, {"format": MANIFEST_FORMAT, "files": files, "previous": current})
    return files


def commit(folder: Path, files: dict[str, Entry]) -> None:
    """Phase 3: every file of the save is in place."""
    _write(folder, {"format": MANIFEST_FORMAT, "files": files})


def _write(folder: Path, manifest: dict[str, Any]) -> None:
    atomic.atomic_write_text(folder / MANIFEST, json.dumps(manifest, indent=2) + "\n")
