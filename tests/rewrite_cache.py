"""Writes pytest's cache of rewritten test modules once, on every core, before the suite's workers start.

Pytest rewrites the asserts of each test module (and conftest.py) it imports, an AST pass over the whole file: 7–9
CPU-s for this suite here, nearly half of collecting it (15–18 CPU-s). It keeps the result in
`__pycache__/NAME.cpython-3X-pytest-V.pyc`, checked by the source's hash, but writes it only where bytecode may be
written (not under PYTHONDONTWRITEBYTECODE, as in many containers and here), and on a fresh clone every worker of
`pytest -n N` collects every file at the same time: each of the N rewrote all of them. `./dev test` runs this first,
in the background beside the other set-up steps; the workers then read the cache.

It uses pytest's own rewrite and pyc format (`_pytest.assertion.rewrite`), so the cached code is what pytest would
have written; the rewrite options the suite leaves at their defaults (`enable_assertion_pass_hook`) are pytest's
defaults here too. Only a speed-up: a file that does not parse is left for pytest to report when it collects it, and
where pytest's internals differ this exits with an error that `./dev test` ignores; the workers then rewrite as they
always did.

    python tests/rewrite_cache.py [FOLDER]      (default: this file's folder)
"""

from __future__ import annotations

import os
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

SKIPPED = {"__pycache__", "node_modules"}


def rewritten(folder: Path) -> list[Path]:
    """The files under `folder` pytest rewrites when it collects them: test_*.py, *_test.py, conftest.py."""
    return sorted(p for p in folder.rglob("*.py") if not SKIPPED.intersection(p.parts)
                  and (p.name.startswith("test_") or p.name.endswith("_test.py") or p.name == "conftest.py"))


def _cache_of(source: Path) -> Path:
    from _pytest.assertion import rewrite

    return rewrite.get_cache_dir(source) / (source.name[:-3] + rewrite.PYC_TAIL)


def stale(source: Path) -> bool:
    """Whether pytest would rewrite `source` again: no cached entry, or one of another version of the file."""
    from _pytest.assertion import rewrite

    return rewrite._read_pyc(source, _cache_of(source)) is None


def prime(path: str) -> bool:
    """Rewrite one file into pytest's cache; whether it wrote one."""
    from _pytest.assertion import rewrite

    source = Path(path)
    pyc = _cache_of(source)
    try:
        source_hash, code = rewrite._rewrite_test(source, None)
    except SyntaxError:
        return False
    if not rewrite.try_makedirs(pyc.parent):
        return False
    partial = pyc.parent / f"{pyc.name}.{os.getpid()}"
    with open(partial, "wb") as out:  # pytest's own writer, made atomic as pytest makes it
        rewrite._write_pyc_fp(out, source_hash, code)
    os.replace(partial, pyc)
    return True


def main(argv: list[str]) -> int:
    folder = Path(argv[0]) if argv else Path(__file__).parent
    files = rewritten(folder)
    todo = [str(p) for p in files if stale(p)]  # an up-to-date cache costs a hash of each file, no pool
    written = 0
    if todo:
        with ProcessPoolExecutor() as pool:
            written = sum(pool.map(prime, todo, chunksize=8))
    print(f"pytest's rewrite cache: {written} of {len(files)} files rewritten")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
