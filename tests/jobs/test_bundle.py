"""Bundles: determinism, ignore rules, refusals when building, and hostile tars when extracting."""

from __future__ import annotations

import hashlib
import io
import os
import socket
import subprocess
import sys
import tarfile
import textwrap
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trainmaster.jobs import bundle
from trainmaster.jobs.bundle import (
    SPEC_MEMBER,
    BundleError,
    build_bundle,
    bundle_digest,
    collect,
    extract_bundle,
    read_spec,
)
from trainmaster.jobs.ignore import IgnoreRules

SPEC = b'{"name":"demo"}'


# --- helpers -----------------------------------------------------------------------------------


def make_tree(root: Path, files: dict[str, bytes | str]) -> Path:
    """Create `files` (path -> content) under `root`; a path ending in `/` is an empty directory."""
    for rel, content in files.items():
        path = root / rel
        if rel.endswith("/"):
            path.mkdir(parents=True, exist_ok=True)
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content.encode() if isinstance(content, str) else content)
    root.mkdir(parents=True, exist_ok=True)
    return root


def paths(code_dir: Path) -> set[str]:
    return {e.path for e in collect(code_dir)}


def read_tree(root: Path) -> dict[str, object]:
    """path -> bytes for files, ("link", target) for symlinks, "dir" for directories."""
    tree: dict[str, object] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = Path(dirpath, name)
            rel = path.relative_to(root).as_posix()
            if path.is_symlink():
                tree[rel] = ("link", os.readlink(path))
            elif path.is_dir():
                tree[rel] = "dir"
            else:
                tree[rel] = path.read_bytes()
    return tree


def snapshot(root: Path) -> set[str]:
    return {p.relative_to(root).as_posix() for p in root.rglob("*")}


def sha256_file(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def code(tmp_path: Path) -> Path:
    return make_tree(
        tmp_path / "code",
        {
            "train.py": "print('hi')\n",
            "run.sh": "#!/bin/sh\necho run\n",
            "pkg/__init__.py": "",
            "pkg/model.py": "W = 1\n",
            "data/small.csv": "a,b\n1,2\n",
            "empty/": "",
        },
    )


# --- determinism -------------------------------------------------------------------------------


def test_same_tree_elsewhere_with_other_mtimes_and_modes_has_the_same_sha256(tmp_path: Path) -> None:
    files = {"a.py": "x = 1\n", "b/c.txt": "c", "b/d/e.bin": os.urandom(5000), "run.sh": "#!/bin/sh\n", "f/": ""}
    one = make_tree(tmp_path / "one", files)
    two = make_tree(tmp_path / "elsewhere" / "two", dict(reversed(files.items())))  # other creation order
    (one / "run.sh").chmod(0o755)
    (two / "run.sh").chmod(0o700)  # another exec mode: still "executable"
    (one / "a.py").chmod(0o644)
    (two / "a.py").chmod(0o600)
    (two / "b" / "c.txt").chmod(0o664)
    (two / "b").chmod(0o700)
    for path in two.rglob("*"):
        os.utime(path, (1_234_567_890, 1_234_567_890), follow_symlinks=False)

    a = build_bundle(one, SPEC, tmp_path / "out1")
    b = build_bundle(two, SPEC, tmp_path / "out2")

    assert a.sha256 == b.sha256
    assert a.size == b.size
    assert a.files == b.files == 4
    assert bundle_digest(one, SPEC) == bundle.BundleInfo(a.sha256, a.size, a.files, None)
    assert sha256_file(a.path) == a.sha256
    assert a.path == tmp_path / "out1" / f"{a.sha256}.tar"
    assert a.path.stat().st_size == a.size


def test_changing_one_byte_changes_the_sha256(code: Path) -> None:
    before = bundle_digest(code, SPEC).sha256
    (code / "pkg" / "model.py").write_text("W = 2\n")
    assert bundle_digest(code, SPEC).sha256 != before


def test_the_exec_bit_and_the_spec_are_part_of_the_sha256(code: Path) -> None:
    before = bundle_digest(code, SPEC).sha256
    assert bundle_digest(code, b'{"name":"other"}').sha256 != before
    (code / "train.py").chmod(0o755)
    assert bundle_digest(code, SPEC).sha256 != before


def test_members_are_sorted_with_zeroed_times_and_owners_and_normalised_modes(code: Path, tmp_path: Path) -> None:
    (code / "run.sh").chmod(0o750)
    (code / "train.py").chmod(0o600)
    os.symlink("../train.py", code / "pkg" / "link.py")
    info = build_bundle(code, SPEC, tmp_path / "out")

    with tarfile.open(info.path) as tar:
        members = tar.getmembers()
    names = [m.name for m in members]
    assert names == sorted(names)
    assert set(names) == {
        ".trainmaster", SPEC_MEMBER, "data", "data/small.csv", "empty", "pkg", "pkg/__init__.py",
        "pkg/link.py", "pkg/model.py", "run.sh", "train.py",
    }  # fmt: skip
    for m in members:
        assert (m.mtime, m.uid, m.gid, m.uname, m.gname) == (0, 0, 0, "", "")
        assert not {"mtime", "atime", "ctime"} & set(m.pax_headers)
    modes = {m.name: m.mode for m in members}
    assert modes["run.sh"] == 0o755
    assert modes["train.py"] == 0o644
    assert modes["pkg"] == modes["empty"] == 0o755
    assert info.path.read_bytes()[257:263] == b"ustar\x00"  # POSIX (pax) magic, not GNU


def test_the_format_is_pinned(tmp_path: Path) -> None:
    """A fixed tree has a fixed sha256 (the same on CPython 3.10 to 3.13); a change here breaks every
    content address already handed out, so it must be deliberate."""
    code = make_tree(
        tmp_path / "code",
        {"a.py": "print(1)\n", "sub/b.txt": "x", "empty/": "", "d" * 120 + ".txt": "long", "données/é.txt": "é\n"},
    )
    os.symlink("../a.py", code / "sub" / "l")
    assert bundle_digest(code, b'{"a":1}') == bundle.BundleInfo(
        "41caa76901f506d5cf1e898c3174cedc7fee0bf13936a5ab8010d2b20f6f2a60", 20480, 4, None
    )


def test_long_and_non_ascii_names_round_trip(tmp_path: Path) -> None:
    long_name = "d" * 120 + "/" + "f" * 150 + ".txt"
    code = make_tree(tmp_path / "code", {long_name: "long", "données/é.txt": "accent"})
    info = build_bundle(code, SPEC, tmp_path / "out")
    extract_bundle(info.path, tmp_path / "x")
    assert (tmp_path / "x" / long_name).read_text() == "long"
    assert (tmp_path / "x" / "données" / "é.txt").read_text() == "accent"


# --- round trip and reuse ----------------------------------------------------------------------


def test_build_then_extract_gives_identical_contents(code: Path, tmp_path: Path) -> None:
    (code / "run.sh").chmod(0o755)
    (code / "blob.bin").write_bytes(os.urandom(3 * 1024 * 1024 + 7))
    info = build_bundle(code, SPEC, tmp_path / "out")
    dest = tmp_path / "extracted"

    extract_bundle(info.path, dest, expected_sha256=info.sha256)

    extracted = read_tree(dest)
    assert extracted.pop(".trainmaster") == "dir"
    assert extracted.pop(SPEC_MEMBER) == SPEC
    assert extracted == read_tree(code)
    assert os.access(dest / "run.sh", os.X_OK)
    assert not os.access(dest / "train.py", os.X_OK)
    assert read_spec(info.path) == SPEC
    assert snapshot(tmp_path) - snapshot(tmp_path / "code") >= {"extracted", "out"}
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_a_python_without_tarfiles_extraction_filters_extracts_nothing_and_says_which_it_needs(
        code: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Python before 3.10.12 / 3.11.4 (Debian 12's own 3.11.2) has no PEP 706 filters: a clear refusal, not an
    AttributeError from the `except tarfile.FilterError` clause."""
    info = build_bundle(code, SPEC, tmp_path / "out")
    monkeypatch.delattr(tarfile, "data_filter")
    monkeypatch.delattr(tarfile, "FilterError")
    with pytest.raises(BundleError, match=r"has no tarfile extraction filters \(PEP 706\).*3\.10\.12\+, 3\.11\.4\+"):
        extract_bundle(info.path, tmp_path / "x", expected_sha256=info.sha256)
    assert not (tmp_path / "x").exists() and not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_an_existing_bundle_is_reused_and_no_temp_file_is_left(code: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    first = build_bundle(code, SPEC, out)
    inode = first.path.stat().st_ino
    second = build_bundle(code, SPEC, out)
    assert second == first
    assert second.path.stat().st_ino == inode
    assert [p.name for p in out.iterdir()] == [f"{first.sha256}.tar"]


def test_spec_must_be_bytes(code: Path) -> None:
    with pytest.raises(TypeError, match="bytes"):
        bundle_digest(code, '{"name": "x"}')  # type: ignore[arg-type]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    files=st.dictionaries(
        st.lists(st.text("abcXYZ_-.é0", min_size=1, max_size=6).filter(lambda s: s not in {".", ".."}), min_size=1, max_size=3)
        .map("/".join),
        st.binary(max_size=2000),
        min_size=1,
        max_size=12,
    )
)
def test_round_trip_of_arbitrary_trees(tmp_path_factory: pytest.TempPathFactory, files: dict[str, bytes]) -> None:
    # A path that is also a prefix of another path cannot be both a file and a directory.
    files = {p: c for p, c in files.items() if not any(q.startswith(p + "/") for q in files)}
    files = {p: c for p, c in files.items() if not p.endswith(".pyc")}
    base = tmp_path_factory.mktemp("rt")
    code = make_tree(base / "code", files)
    info = build_bundle(code, SPEC, base / "out")
    extract_bundle(info.path, base / "x", expected_sha256=info.sha256)
    got = {p: c for p, c in read_tree(base / "x").items() if isinstance(c, bytes)}
    assert got == {**files, SPEC_MEMBER: SPEC}


# --- ignore rules ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "ignored",
    [
        ".git/config",
        ".git",  # a submodule's .git file
        "__pycache__/m.cpython-311.pyc",
        "pkg/__pycache__/x.txt",
        "pkg/stale.pyc",
        ".venv/lib/site.py",
        "venv/bin/python",
        "sub/venv/x",
        "myenv/pyvenv.cfg",  # any directory holding pyvenv.cfg is a virtualenv
        ".trainmaster/spec.json",
        "web/node_modules/left-pad/index.js",
        ".pytest_cache/v/cache",
        ".mypy_cache/3.11/x.json",
    ],
)
def test_built_in_ignores(tmp_path: Path, ignored: str) -> None:
    code = make_tree(tmp_path / "code", {"keep.py": "", ignored: "x"})
    if ignored == "myenv/pyvenv.cfg":
        (code / "myenv" / "lib.py").write_text("")
    top = ignored.split("/")[0]
    kept = paths(code)
    assert "keep.py" in kept
    assert not any(p == ignored or p.startswith(ignored + "/") for p in kept)
    if top not in ("pkg", "web", "sub"):
        assert top not in kept


def test_a_symlinked_venv_is_ignored_too(tmp_path: Path) -> None:
    venv = make_tree(tmp_path / "venvs" / "py", {"pyvenv.cfg": ""})
    code = make_tree(tmp_path / "code", {"a.py": ""})
    os.symlink(venv, code / ".venv")
    assert paths(code) == {"a.py"}


def test_code_dir_spec_is_never_taken_from_the_tree(tmp_path: Path) -> None:
    code = make_tree(tmp_path / "code", {"a.py": "", ".trainmaster/spec.json": "forged"})
    info = build_bundle(code, SPEC, tmp_path / "out")
    assert read_spec(info.path) == SPEC


def test_trainmasterignore_patterns(tmp_path: Path) -> None:
    code = make_tree(
        tmp_path / "code",
        {
            ".trainmasterignore": textwrap.dedent(
                """\
                # comments and blank lines are skipped

                *.log
                !keep.log
                build/
                /data/raw
                out/*
                !out/keep.txt
                logs/
                !logs/important.txt
                docs/**/*.tmp
                """
            ),
            "a.log": "",
            "keep.log": "",
            "sub/b.log": "",
            "sub/keep.log": "",
            "build/x.o": "",
            "src/build/y.o": "",
            "src/build.py": "",
            "notes/build": "a file named build: dir-only pattern does not match it",
            "data/raw/big.bin": "",
            "data/clean.csv": "",
            "sub/data/raw/kept.bin": "",
            "out/drop.txt": "",
            "out/keep.txt": "",
            "logs/important.txt": "",
            "docs/a/b/x.tmp": "",
            "docs/y.tmp": "",
            "docs/keep.md": "",
            "# comments and blank lines are skipped": "",
        },
    )
    assert paths(code) == {
        ".trainmasterignore", "# comments and blank lines are skipped",
        "keep.log", "sub", "sub/keep.log",
        "src", "src/build.py", "notes", "notes/build",
        "data", "data/clean.csv", "sub/data", "sub/data/raw", "sub/data/raw/kept.bin",
        "out", "out/keep.txt",
        "docs", "docs/a", "docs/a/b", "docs/keep.md",
    }  # fmt: skip


@pytest.mark.parametrize(
    ("pattern", "path", "is_dir", "ignored"),
    [
        ("*.txt", "a/b/c.txt", False, True),
        ("a/*.txt", "a/b/c.txt", False, False),  # `*` does not cross `/`
        ("a/**/c.txt", "a/b/x/c.txt", False, True),
        ("a/**/c.txt", "a/c.txt", False, True),
        ("**/c.txt", "x/y/c.txt", False, True),
        ("a/**", "a/b/c", False, True),
        ("file?.py", "file1.py", False, True),
        ("file?.py", "file10.py", False, False),
        ("file[0-9].py", "sub/file7.py", False, True),
        ("file[!0-9].py", "filex.py", False, True),
        ("file[!0-9].py", "file7.py", False, False),
        ("a[!x]b", "a/b", False, False),  # a negated class never matches `/`
        ("\\#x", "#x", False, True),
        ("\\!x", "!x", False, True),
        ("tmp/", "tmp", False, False),
        ("tmp/", "tmp", True, True),
        ("/top", "top", False, True),
        ("/top", "sub/top", False, False),
        ("[unclosed", "[unclosed", False, False),  # as in git: an unclosed class matches nothing
    ],
)
def test_ignore_pattern_syntax(pattern: str, path: str, is_dir: bool, ignored: bool) -> None:
    assert IgnoreRules.parse(pattern).ignored(path, is_dir=is_dir) is ignored


def test_last_matching_pattern_wins() -> None:
    rules = IgnoreRules.parse("*.csv\n!important.csv\nimportant.csv\n")
    assert rules.ignored("important.csv", is_dir=False)
    assert not IgnoreRules.parse("").ignored("x", is_dir=False)


# --- refusals when building --------------------------------------------------------------------


def test_over_the_limit_is_refused_before_anything_is_written(code: Path, tmp_path: Path) -> None:
    (code / "data" / "huge.bin").write_bytes(b"\0" * 300_000)
    dest = tmp_path / "out"
    with pytest.raises(BundleError) as excinfo:
        build_bundle(code, SPEC, dest, max_bytes=200_000)
    message = str(excinfo.value)
    assert "over the 195.3 KiB limit" in message
    assert "bundle would be 293." in message
    assert ".trainmasterignore" in message
    assert "data/huge.bin" in message
    assert not dest.exists()
    with pytest.raises(BundleError, match="over the"):
        collect(code, max_bytes=200_000)
    with pytest.raises(BundleError, match="over the"):
        bundle_digest(code, SPEC, max_bytes=200_000)


def test_over_the_limit_leaves_an_existing_dest_dir_untouched(code: Path, tmp_path: Path) -> None:
    dest = make_tree(tmp_path / "out", {"other.tar": "x"})
    (code / "big.bin").write_bytes(b"\0" * 5000)
    with pytest.raises(BundleError):
        build_bundle(code, SPEC, dest, max_bytes=4000)
    assert [p.name for p in dest.iterdir()] == ["other.tar"]


def test_missing_or_non_directory_code_dir_is_refused(tmp_path: Path) -> None:
    with pytest.raises(BundleError, match="does not exist"):
        collect(tmp_path / "nope")
    (tmp_path / "file").write_text("")
    with pytest.raises(BundleError, match="not a directory"):
        build_bundle(tmp_path / "file", SPEC, tmp_path / "out")


def test_symlink_to_a_file_outside_is_refused_naming_link_and_target(code: Path, tmp_path: Path) -> None:
    secret = make_tree(tmp_path / "elsewhere", {"secret.txt": "s"}) / "secret.txt"
    os.symlink(secret, code / "pkg" / "creds.txt")
    dest = tmp_path / "out"
    with pytest.raises(BundleError) as excinfo:
        build_bundle(code, SPEC, dest)
    assert "pkg/creds.txt" in str(excinfo.value)
    assert str(secret) in str(excinfo.value)
    assert not dest.exists()


def test_relative_symlink_escaping_the_tree_is_refused(code: Path, tmp_path: Path) -> None:
    (tmp_path / "outside.txt").write_text("o")
    os.symlink("../../outside.txt", code / "pkg" / "up.txt")
    with pytest.raises(BundleError, match=r"pkg/up.txt -> \.\./\.\./outside\.txt.*outside the code directory"):
        collect(code)


def test_symlinks_inside_are_preserved_with_relative_targets(code: Path, tmp_path: Path) -> None:
    os.symlink("../train.py", code / "pkg" / "train_link.py")
    os.symlink(code / "data", code / "data_abs")  # absolute, but inside: stored relative
    os.symlink("pkg", code / "pkg_link")
    entries = {e.path: e for e in collect(code)}
    assert entries["pkg/train_link.py"].target == "../train.py"
    assert entries["data_abs"].target == "data"
    assert "pkg_link/model.py" not in entries  # a symlinked directory is not walked

    info = build_bundle(code, SPEC, tmp_path / "out")
    dest = tmp_path / "x"
    extract_bundle(info.path, dest)
    assert os.readlink(dest / "pkg" / "train_link.py") == "../train.py"
    assert os.readlink(dest / "data_abs") == "data"
    assert (dest / "pkg_link" / "model.py").read_text() == "W = 1\n"
    assert (dest / "data_abs" / "small.csv").read_text() == "a,b\n1,2\n"


@pytest.mark.parametrize("target", ["missing.py", "pkg/__pycache__/x.pyc", "loop_b"])
def test_symlink_to_something_not_in_the_bundle_is_refused(code: Path, target: str) -> None:
    (code / "pkg" / "__pycache__").mkdir()
    (code / "pkg" / "__pycache__" / "x.pyc").write_bytes(b"")
    os.symlink("loop_a", code / "loop_b")
    os.symlink("loop_b", code / "loop_a")
    if target != "loop_b":
        (code / "loop_a").unlink()
        (code / "loop_b").unlink()
    os.symlink(target, code / "link")
    with pytest.raises(BundleError, match="link -> .*not in the bundle"):
        collect(code)


@pytest.mark.parametrize("kind", ["fifo", "socket"])
def test_special_files_are_refused_unless_ignored(code: Path, kind: str) -> None:
    path = code / "pkg" / "special"
    if kind == "fifo":
        os.mkfifo(path)
    else:
        sock = socket.socket(socket.AF_UNIX)
        sock.bind(str(path))
        sock.close()
    with pytest.raises(BundleError, match=f"pkg/special is a {kind}"):
        collect(code)
    (code / ".trainmasterignore").write_text("special\n")
    assert "pkg/special" not in paths(code)


def test_a_full_disk_leaves_no_temp_file_and_says_no_space(tmp_path: Path) -> None:
    code = make_tree(tmp_path / "code", {"big.bin": os.urandom(3 * 1024 * 1024), "a.py": "x"})
    dest = tmp_path / "out"
    dest.mkdir()
    script = textwrap.dedent(
        """
        import resource, signal, sys
        from pathlib import Path
        from trainmaster.jobs.bundle import BundleError, build_bundle

        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # so a write past the limit raises OSError
        resource.setrlimit(resource.RLIMIT_FSIZE, (1024 * 1024, 1024 * 1024))
        try:
            build_bundle(Path(sys.argv[1]), b"{}", Path(sys.argv[2]))
        except BundleError as e:
            print(f"BundleError: {e}")
            sys.exit(3)
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script, str(code), str(dest)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 3, result.stdout + result.stderr
    assert "BundleError: no space left" in result.stdout
    assert list(dest.iterdir()) == []


# --- hostile tars ------------------------------------------------------------------------------


def member(name: str, data: bytes = b"", *, type: bytes = tarfile.REGTYPE, linkname: str = "") -> tuple:
    info = tarfile.TarInfo(name)
    info.type = type
    info.linkname = linkname
    info.size = len(data) if type == tarfile.REGTYPE else 0
    return info, data


def write_tar(path: Path, members: list[tuple]) -> Path:
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if info.isreg() else None)
    return path


SPEC_MEMBERS = [member(".trainmaster", type=tarfile.DIRTYPE), member(SPEC_MEMBER, SPEC)]

HOSTILE = {
    "absolute name": ([member("/tmp/outside/pwned", b"x")], "'/tmp/outside/pwned' is an absolute path"),
    "dotdot": ([member("../outside/pwned", b"x")], "'../outside/pwned' has a '..' component"),
    "dotdot inside": ([member("a/../../outside/pwned", b"x")], "'a/../../outside/pwned' has a '..'"),
    "absolute symlink": ([member("etc", type=tarfile.SYMTYPE, linkname="/etc")], "symlink 'etc' -> '/etc'"),
    "escaping symlink": (
        [member("sub/up", type=tarfile.SYMTYPE, linkname="../../outside")],
        "symlink 'sub/up' -> '../../outside' points outside",
    ),
    "symlink escaping through another symlink": (
        [
            member("d1/d2/a", type=tarfile.SYMTYPE, linkname="b/../../.."),  # lexically inside...
            member("d1/d2/b", type=tarfile.SYMTYPE, linkname=".."),  # ...but b/.. is d1/.., the root
        ],
        "symlink 'd1/d2/a' -> 'b/../../..' goes through the symlink member 'd1/d2/b'",
    ),
    "absolute hardlink": ([member("passwd", type=tarfile.LNKTYPE, linkname="/etc/passwd")], "hardlink 'passwd'"),
    "escaping hardlink": ([member("h", type=tarfile.LNKTYPE, linkname="../outside/x")], "hardlink 'h' -> '../outside/x'"),
    "hardlink to nothing": ([member("h", type=tarfile.LNKTYPE, linkname="nope")], "hardlink 'h' -> 'nope' does not"),
    "char device": ([member("dev/null", type=tarfile.CHRTYPE)], "'dev/null' is a character device"),
    "block device": ([member("sda", type=tarfile.BLKTYPE)], "'sda' is a block device"),
    "fifo": ([member("pipe", type=tarfile.FIFOTYPE)], "'pipe' is a fifo"),
    "duplicate": ([member("a.txt", b"1"), member("a.txt", b"2")], "duplicate member 'a.txt'"),
    "duplicate after normalising": ([member("a.txt", b"1"), member("./a.txt", b"2")], "duplicate member './a.txt'"),
    "through a symlink member": (
        [member("link", type=tarfile.SYMTYPE, linkname="sub"), member("sub/", type=tarfile.DIRTYPE), member("link/x", b"x")],
        "'link/x' goes through the symlink member 'link'",
    ),
    "through a symlink member declared later": (
        [member("link/x", b"x"), member("link", type=tarfile.SYMTYPE, linkname=".")],
        "'link/x' goes through the symlink member 'link'",
    ),
    "through a file": ([member("f", b"x"), member("f/g", b"y")], "'f/g' goes through 'f', which is not a directory"),
}


@pytest.mark.parametrize("case", HOSTILE, ids=list(HOSTILE))
def test_hostile_tar_is_refused_and_leaves_nothing(tmp_path: Path, case: str) -> None:
    members, reason = HOSTILE[case]
    (tmp_path / "outside").mkdir()
    tar_path = write_tar(tmp_path / "hostile.tar", [*SPEC_MEMBERS, member("ok.txt", b"fine"), *members])
    dest = tmp_path / "work" / "dest"
    dest.parent.mkdir()
    before = snapshot(tmp_path)

    with pytest.raises(BundleError) as excinfo:
        extract_bundle(tar_path, dest)

    assert reason in str(excinfo.value)
    assert snapshot(tmp_path) == before  # nothing at dest, no temp dir, nothing outside
    assert not Path("/tmp/outside/pwned").exists()
    with pytest.raises(BundleError):
        read_spec(tar_path)


def test_member_and_total_size_limits(tmp_path: Path) -> None:
    tar_path = write_tar(tmp_path / "t.tar", [member("a", b"x" * 40), member("b", b"x" * 40), member("c", b"x" * 40)])
    with pytest.raises(BundleError, match=r"member 'a' declares 40 B, over the 39 B per-member limit"):
        extract_bundle(tar_path, tmp_path / "d1", max_member_bytes=39)
    with pytest.raises(BundleError, match=r"member 'c' brings the declared size to 120 B, over the 100 B total"):
        extract_bundle(tar_path, tmp_path / "d2", max_total_bytes=100)
    assert snapshot(tmp_path) == {"t.tar"}


def test_a_header_claiming_10_gb_is_refused_without_reading_data(tmp_path: Path) -> None:
    info = tarfile.TarInfo("big.bin")
    info.size = 10 * 1024**3
    tar_path = tmp_path / "claim.tar"
    tar_path.write_bytes(info.tobuf(tarfile.PAX_FORMAT))  # the header alone: the data is not there
    assert tar_path.stat().st_size < 4096

    with pytest.raises(BundleError, match=r"member 'big.bin' declares 10.0 GiB, over the 2.0 GiB per-member limit"):
        extract_bundle(tar_path, tmp_path / "dest")  # refused from the header: the data is not even there
    assert snapshot(tmp_path) == {"claim.tar"}


def test_an_oversized_pax_header_is_refused_before_it_is_read(tmp_path: Path) -> None:
    info = tarfile.TarInfo("././@PaxHeader")
    info.type = tarfile.XHDTYPE
    info.size = 1024**3
    tar_path = tmp_path / "pax.tar"
    tar_path.write_bytes(info.tobuf(tarfile.USTAR_FORMAT))
    with pytest.raises(BundleError, match="declares 1.0 GiB of metadata"):
        extract_bundle(tar_path, tmp_path / "dest")
    assert snapshot(tmp_path) == {"pax.tar"}


def test_sha256_mismatch_is_refused(code: Path, tmp_path: Path) -> None:
    info = build_bundle(code, SPEC, tmp_path / "out")
    with pytest.raises(BundleError, match=f"has sha256 {info.sha256}, expected {'0' * 64}"):
        extract_bundle(info.path, tmp_path / "dest", expected_sha256="0" * 64)
    assert not (tmp_path / "dest").exists()
    extract_bundle(info.path, tmp_path / "dest", expected_sha256=info.sha256.upper())
    assert (tmp_path / "dest" / "train.py").exists()


def test_existing_dest_and_unreadable_tars_are_refused(code: Path, tmp_path: Path) -> None:
    info = build_bundle(code, SPEC, tmp_path / "out")
    (tmp_path / "taken").mkdir()
    with pytest.raises(BundleError, match="already exists"):
        extract_bundle(info.path, tmp_path / "taken")
    garbage = tmp_path / "garbage.tar"
    garbage.write_bytes(b"this is not a tar" * 100)
    with pytest.raises(BundleError, match="not a readable tar"):
        extract_bundle(garbage, tmp_path / "dest")
    truncated = tmp_path / "truncated.tar"
    truncated.write_bytes(info.path.read_bytes()[:1200])
    with pytest.raises(BundleError):
        extract_bundle(truncated, tmp_path / "dest")
    with pytest.raises(BundleError, match="cannot open"):
        read_spec(tmp_path / "missing.tar")
    assert not (tmp_path / "dest").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_read_spec_refuses_a_bundle_without_one(tmp_path: Path) -> None:
    tar_path = write_tar(tmp_path / "t.tar", [member("a.txt", b"x")])
    with pytest.raises(BundleError, match=f"has no {SPEC_MEMBER}"):
        read_spec(tar_path)


def test_the_data_filter_is_a_second_line_of_defence(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bundle, "_check_tree", lambda members: None)  # pretend our own checks missed it
    tar_path = write_tar(tmp_path / "t.tar", [member("up", type=tarfile.SYMTYPE, linkname="../../outside")])
    with pytest.raises(BundleError, match="'up' refused by tarfile's data filter"):
        extract_bundle(tar_path, tmp_path / "dest")
    assert snapshot(tmp_path) == {"t.tar"}


def test_too_many_members_are_refused_before_extraction(tmp_path, monkeypatch):
    import io
    import tarfile

    from trainmaster.jobs import bundle as bundle_module

    monkeypatch.setattr(bundle_module, "MAX_MEMBERS", 10)
    tar_path = tmp_path / "many.tar"
    with tarfile.open(tar_path, "w") as tar:
        for i in range(11):
            info = tarfile.TarInfo(f"f{i}")
            tar.addfile(info, io.BytesIO(b""))
    with pytest.raises(bundle_module.BundleError, match="more than 10 members"):
        bundle_module.extract_bundle(tar_path, tmp_path / "out")
    assert not (tmp_path / "out").exists()
