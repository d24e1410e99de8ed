"""Whether bytes are a pickle opcode stream, whatever their protocol: protocols 0 and 1 have no magic
bytes (protocol 0 is printable ASCII), so a pickle named ``notes.txt`` is found only by parsing it.

The bytes are walked with ``pickletools.genops`` (parsing, never loading), within what the caller
read (bounded: verify/output_kinds.py reads the first 64 KiB of a file, 10 KB of an archive member:
at most one opcode per byte). They are a pickle when

- the opcodes run to a STOP and ``pickletools.dis`` finds the stack and memo consistent (a complete
  pickle: ``pickle.load`` returns an object), or
- the opcodes before the first unparseable byte import a callable by a dotted name and then call it
  (``pickle.load`` runs those opcodes before it meets the bad byte), or
- the bytes read end while the opcodes still parse and more bytes follow (no text parses as opcodes
  for that long).

Real text fails in its first few bytes: a letter or punctuation that is no opcode, or an argument
line that is not a number.
"""

from __future__ import annotations

import io
import pickletools
import re

IMPORTS = frozenset({"GLOBAL", "INST", "STACK_GLOBAL", "EXT1", "EXT2", "EXT4"})
CALLS = frozenset({"REDUCE", "BUILD", "INST", "OBJ", "NEWOBJ", "NEWOBJ_EX"})
DOTTED_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")


class _Nowhere(io.TextIOBase):
    """Where ``pickletools.dis`` writes its listing: nowhere."""

    def write(self, text: str) -> int:
        return len(text)


def pickle_stream(data: bytes, *, complete: bool) -> str | None:
    """What ``data`` (a file's or member's first bytes; ``complete``: all of it) is as a pickle —
    "a pickle stream (protocol 0)" — or None when it is no pickle."""
    protocol, imported, runs, stopped, count = 0, False, False, None, 0
    stream = io.BytesIO(data)
    try:
        for opcode, arg, position in pickletools.genops(stream):
            count += 1
            protocol = max(protocol, opcode.proto)
            runs = runs or (imported and opcode.name in CALLS)
            imported = imported or (opcode.name in IMPORTS and _importable(opcode.name, arg))
            if opcode.name == "STOP":
                stopped = position
    except (ValueError, UnicodeDecodeError, OverflowError, TypeError):
        if runs:
            return f"a pickle stream (protocol {protocol}) that calls code before its first unreadable byte"
        if not complete and stream.tell() >= len(data) and count > 1:
            return f"the start of a pickle stream (protocol {protocol}) longer than was read"
        return None
    if stopped is not None and count > 1 and _consistent(data[: stopped + 1]):
        return f"a pickle stream (protocol {protocol})"
    if runs:
        return f"a pickle stream (protocol {protocol}) that calls code"
    if not complete and count > 1 and stopped is None:
        return f"the start of a pickle stream (protocol {protocol}) longer than was read"
    return None


def _importable(name: str, arg) -> bool:
    """Whether an import opcode's argument could name a module and attribute (``"os system"``)."""
    if name in ("GLOBAL", "INST"):
        return isinstance(arg, str) and all(DOTTED_NAME.fullmatch(part) for part in arg.split(" ", 1))
    return True


def _consistent(data: bytes) -> bool:
    """Whether ``pickletools.dis`` walks the whole stream with its stack and memo consistent."""
    try:
        pickletools.dis(data, out=_Nowhere())
    except (ValueError, UnicodeDecodeError, OverflowError, TypeError, IndexError, KeyError):
        return False
    return True
