"""Looking into a returned tar archive (plain or gzip/bz2/xz-compressed) within the bounds of
verify/zip_bounds.py, for verify/output_kinds.py.

A tar has no directory: its members are read header by header. So:

- at most ``output_kinds.MAX_MEMBERS`` members, and at most ``zip_bounds.MAX_UNCOMPRESSED_BYTES``
  declared by them all, else the archive is not looked into further (unchecked);
- each member header spends ``zip_bounds.MEMBER_COST`` of the verification's budget, each member's
  first bytes what is read of them, and in a compressed tar each member's declared size too
  (skipping a member means decompressing it);
- a link, device or FIFO member makes the archive unchecked (never extracted anyway);
- the legacy ``torch.save`` format (``_use_new_zipfile_serialization=False``) is a tar of ``sys_info``,
  ``pickle``, ``tensors`` and ``storages``: named as such.

Each member's first bytes are judged by the caller's ``member_kind`` (the one zip members get).
"""

from __future__ import annotations

import tarfile
from collections.abc import Callable

from .zip_bounds import MAX_UNCOMPRESSED_BYTES, MEMBER_COST, Budget

TORCH_LEGACY_MEMBERS = frozenset({"sys_info", "pickle", "storages", "tensors"})
Verdict = tuple[str, str]
"""``(kind, what)``: a kind name of verify/output_kinds.py and its phrase."""


def tar_verdict(archive: tarfile.TarFile, budget: Budget, *, compressed: bool, max_members: int,
                member_kind: Callable[[tarfile.TarFile, tarfile.TarInfo, Budget], str | None]) -> Verdict:
    """The kind of the tar ``archive``: "pickle", "unchecked" or "data" with its phrase.
    ``member_kind`` answers "pickle", "unchecked", "budget spent" or None (data) for one member."""
    pickles, unreadable, names, declared, count = [], [], set(), 0, 0
    for info in _members(archive):
        count += 1
        declared += max(info.size, 0)
        if count > max_members:
            return "unchecked", f"a tar archive of more than {max_members} members, not inspected further"
        if declared > MAX_UNCOMPRESSED_BYTES:
            return "unchecked", f"a tar archive whose members declare over {MAX_UNCOMPRESSED_BYTES} bytes, not inspected"
        if not budget.take(MEMBER_COST + (info.size if compressed else 0)):
            unreadable.append("members past the inspection budget")
            break
        if info.isdir():
            continue
        if not info.isfile():
            return "unchecked", f"a tar archive holding a link, device or FIFO ({_cut(info.name)}), not inspected"
        names.add(info.name)
        found = member_kind(archive, info, budget)
        if found == "pickle":
            pickles.append(info.name)
        elif found == "unchecked":
            unreadable.append(info.name)
        elif found is not None:
            unreadable.append(f"{info.name} (past the inspection budget)")
    if pickles:
        legacy = TORCH_LEGACY_MEMBERS <= names or {"pickle", "storages"} <= names
        what = "a torch.save tar archive" if legacy else "a tar archive holding pickles"
        return "pickle", f"{what} (pickles inside: {_few(pickles)})"
    if unreadable:
        return "unchecked", f"a tar archive with members not inspected: {_few(unreadable)}"
    return "data", f"a tar archive of {len(names)} files, none pickle-capable"


def _members(archive: tarfile.TarFile):
    """The members one header at a time (``getmembers`` would list them all first)."""
    while (info := archive.next()) is not None:
        yield info


def _cut(name: str) -> str:
    return name if len(name) <= 80 else name[:77] + "..."


def _few(names: list[str]) -> str:
    shown = [_cut(name) for name in names[:3]]
    return ", ".join(shown) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
