"""Every note reference and every repo path named in a comment resolves.

The code explains itself in GHC-style notes: a note is written once, where
its title heads a comment, and cited by title everywhere else. Files move
(src/*.rs into src/<layer>/, cpp/*.cpp into cpp/<interface>/), so this test
checks the citations against the tree as it is; it holds no list of files.

A note is DEFINED outside tests/ by a line that starts (after any comment
marker or docstring quotes) with its title and then::

    // Note [Title]: text...      a colon,
    # Note [Title]                nothing, and an underline of ~ below,
    # ~~~~~~~~~~~~
    // Note [Title]               nothing, and the comment (or docstring)
    // text...                    goes on below (above code it only cites),

or by a markdown heading ``## Note [Title]``. In tests/ such a line heads
a test with the note it checks: a citation.

A note is REFERENCED anywhere by ``Note [Title]``, ``Notes [A], [B]`` or
``Notes [A] and [B]``; a title may wrap over comment lines. ``in <path>``
after a title (or after the last title of a ``Notes`` list, for those
before it without their own), or ``, <path>)`` after a single one, names
the file that defines it. ``in ATen`` (c10, PyTorch) marks PyTorch's notes.

The rules, each failure listed with its file:line:

1. Every referenced title is defined.
2. ``Note [X] in <path>``: X is defined in that file. A path under a
   top-level folder (``src/``, ``cpp/``, ...) is from the repo root; another
   path with a slash (``torch_openreg/_huggingface.py``, ``conformance/ops.py``)
   is from the citing file's folder, else the files whose path ends with it;
   a bare name (``lifecycle.rs``) is any file of that name.
3. Every repo path in the text exists: ``src/...``, ``cpp/...``,
   ``python/...``, ``tests/...``, ``include/...``, ``docs/...`` (also after
   ``${..._SOURCE_DIR}/``), and an include or package path: ``torch_openreg/cpp/x.h``
   is ``cpp/x.h``, ``torch_openreg/src/bridge/ffi.rs.h`` is cxx's header of
   ``src/bridge/ffi.rs``, ``torch_openreg/x.py`` is ``python/torch_openreg/x.py``,
   ``torch_openreg/kernel.h`` is ``include/torch_openreg/kernel.h``.
   Not repo paths, so not checked: a path right after another ``/`` or ``$``
   (``${dir}/include/c10``, URLs, ``aten/src/...``), globs (``src/*.rs``,
   ``cpp/<interface>/``), torch's include tree (``PYTORCH_INCLUDE``), and
   build output (``build/``, ``target/``).
4. A bare file name cited as ``in name.ext`` or ``(name.ext)`` names a file
   of the repo, unless ``NOT_OURS`` lists it.

Scanned: *.rs, *.cpp, *.h, *.py, *.md, *.cmake(.in), *.sh, *.toml and
CMakeLists.txt, outside build/, target/, hidden, cache and vendored folders.
TORCH_OPENREG_REPO_ROOT points the test at another checkout (by default, the
one this file is in; not OPENREG_*, which the runtime warns of as an
unknown option).
"""

import bisect
import os
import re
from collections import defaultdict
from functools import lru_cache
from pathlib import Path

HERE = Path(__file__).resolve()
ROOT = Path(os.environ.get("TORCH_OPENREG_REPO_ROOT") or HERE.parents[2]).resolve()
# This file quotes the syntax it checks, so it is not scanned.
SELF = HERE.relative_to(HERE.parents[2]).as_posix()

SOURCE_SUFFIXES = (".rs", ".cpp", ".h", ".py", ".md", ".cmake", ".cmake.in", ".sh", ".toml")
SOURCE_NAMES = ("CMakeLists.txt",)
# Build output, at the top level.
BUILD_DIRS = ("target", "build")
# Caches and vendored code, at any depth (hidden folders too).
SKIP_DIRS = ("__pycache__", "node_modules", "third_party", "vendor")
# The repo's top-level source folders: a path that starts with one is from the root.
TOP_DIRS = ("src", "cpp", "python", "include", "tests", "benches", "scripts", "docs", "examples", "cmake")
# Extensions of the files a citation can name.
CITED_EXTS = ("rs", "cpp", "h", "py", "md", "cmake", "sh", "toml", "txt")

# torch's include tree (its install's include/c10, ...), not the repo's include/.
PYTORCH_INCLUDE = ("include/c10", "include/ATen", "include/torch", "include/caffe2")
# Bare file names rule 4 leaves alone: not ours.
NOT_OURS = {
    "autocast_mode.py",  # torch/amp/autocast_mode.py, torch.autocast's device check
    "reductions.py",  # torch/multiprocessing/reductions.py, storage pickling
    "scheduler.py",  # torch/_inductor/scheduler.py, Inductor's loop transformations
    "utils.py",  # torch/_inductor/utils.py, get_current_backend()
    "version.py",  # torch/version.py of a torch wheel, its CUDA version
    "AREA.py",  # a placeholder in docs/integration-points.md: conformance/<area>.py
}

# --- reading the tree


def _walk(skip_hidden: bool):
    """(repo-relative folder, its subfolders, its files) of the tree, pruned."""
    for dirpath, dirnames, filenames in os.walk(ROOT):
        rel = Path(dirpath).relative_to(ROOT).as_posix()
        rel = "" if rel == "." else rel + "/"
        dirnames[:] = sorted(
            d
            for d in dirnames
            if d != ".git"
            and not (rel == "" and d in BUILD_DIRS)
            and not (skip_hidden and (d.startswith(".") or d in SKIP_DIRS or d.endswith(".egg-info")))
            and not (rel == "python/torch_openreg/" and d == "lib")  # the built libraries
        )
        yield rel, dirnames, filenames


@lru_cache(maxsize=None)
def all_paths() -> frozenset[str]:
    """Every file and folder of the repo, scanned or not, relative to the root."""
    return frozenset(rel + name for rel, dirnames, filenames in _walk(False) for name in dirnames + filenames)


@lru_cache(maxsize=None)
def files_by_name() -> dict[str, list[str]]:
    by_name = defaultdict(list)
    for path in all_paths():
        by_name[path.rsplit("/", 1)[-1]].append(path)
    return by_name


# A comment marker and docstring quotes at the start of a line.
LEAD = re.compile(r"""^\s*(?://[/!]?|#+|/\*+|\*+)?\s*(?:[rRbBuU]{0,2}(?:\"\"\"|'''))?\s*""")


class Source:
    """A scanned file: its lines, and its text flattened to one line without
    comment markers, so that a title or a citation that wraps reads whole."""

    def __init__(self, rel: str):
        self.rel = rel
        self.lines = (ROOT / rel).read_text(encoding="utf-8", errors="replace").split("\n")
        bodies = [line[LEAD.match(line).end() :] for line in self.lines]
        self.starts, offset = [], 0
        for body in bodies:
            self.starts.append(offset)
            offset += len(body) + 1
        self.flat = " ".join(bodies)

    def where(self, offset: int) -> str:
        """file:line of an offset into `flat`."""
        return f"{self.rel}:{bisect.bisect_right(self.starts, offset)}"


@lru_cache(maxsize=None)
def sources() -> tuple[Source, ...]:
    return tuple(
        Source(rel + name)
        for rel, _, filenames in _walk(True)
        for name in sorted(filenames)
        if (name.endswith(SOURCE_SUFFIXES) or name in SOURCE_NAMES) and rel + name != SELF
    )


def normalize(title: str) -> str:
    """A title as written, without line wraps and Python string joins."""
    title = re.sub(r"\\(['\"])", r"\1", title)  # 'Lightning\'s ...'
    title = re.sub(r"\s*['\"]\s+['\"]\s*", " ", title)  # '... for an ' "accelerator ..."
    return re.sub(r"\s+", " ", title).strip()


# --- definitions

DEF_LINE = re.compile(
    r"""^\s*(?P<marker>//[/!]?|\#|/\*+|\*)?\s*(?:[rRbBuU]{0,2}(?:\"\"\"|'''))?\s*"""
    r"""Note \[(?P<title>[^\[\]]+)\](?P<colon>:)?(?P<rest>.*)$"""
)
MD_HEADING = re.compile(r"^\s*#{1,6}\s+Note \[(?P<title>[^\[\]]+)\]")
UNDERLINE = re.compile(r"^\s*(?://[/!]?|#|\*)?\s*~{3,}\s*$")


def definitions_in(src: Source) -> list[tuple[str, int]]:
    """(title, line) of each note `src` defines."""
    found = []
    for i, line in enumerate(src.lines):
        heading = MD_HEADING.match(line) if src.rel.endswith(".md") else None
        m = heading or DEF_LINE.match(line)
        if not m:
            continue
        if heading or m["colon"]:
            found.append((normalize(m["title"]), i + 1))
        elif not m["rest"].strip() and i + 1 < len(src.lines):
            after, marker = src.lines[i + 1], m["marker"]
            goes_on = (
                after.lstrip().startswith(marker) and after.lstrip()[len(marker) :].strip()
                if marker
                else after.strip()
            )
            if UNDERLINE.match(after) or goes_on:
                found.append((normalize(m["title"]), i + 1))
    return found


@lru_cache(maxsize=None)
def definitions() -> dict[str, set[str]]:
    """Each defined title, with the files that define it."""
    defined = defaultdict(set)
    for src in sources():
        if not src.rel.startswith("tests/"):
            for title, _ in definitions_in(src):
                defined[title].add(src.rel)
    return defined


# --- references

NOTE_WORD = re.compile(r"\bNotes?\s+(?=\[)")
ITEM = re.compile(r"\[(?P<title>[^\[\]]{1,200})\]")
# The space before `in`, or a Python string join there: '...] ' "in x.py".
BEFORE_IN = r"""(?:\s*['"]\s+['"]\s*|\s+)in\s+"""
PATH = r"""[`'"]*(?P<path>\w[\w./+-]*?\.(?:""" + "|".join(CITED_EXTS) + r"""))(?![\w/+-]|\.\w)[`'"]*"""
IN_PATH = re.compile(BEFORE_IN + PATH)
COMMA_PATH = re.compile(r",\s*" + PATH + r"\s*\)")
IN_PYTORCH = re.compile(BEFORE_IN + r"""[`'"]*(?:ATen|c10|PyTorch)\b(?![/.]\w)""")
NEXT_ITEM = re.compile(r"\s*(?:,|\band\b)\s*(?=\[)")


@lru_cache(maxsize=None)
def references() -> tuple[tuple[Source, int, str, str | None], ...]:
    """(file, offset, title, the path cited with it or None) of every reference."""
    found = []
    for src in sources():
        for m in NOTE_WORD.finditer(src.flat):
            pos, pending, plural = m.end(), [], m.group().startswith("Notes")
            while item := ITEM.match(src.flat, pos):
                pending.append((item.start(), normalize(item["title"])))
                pos = item.end()
                if pytorch := IN_PYTORCH.match(src.flat, pos):
                    pending, pos = [], pytorch.end()  # PyTorch's note, not ours
                elif located := IN_PATH.match(src.flat, pos) or (not plural and COMMA_PATH.match(src.flat, pos)):
                    found += [(src, offset, title, located["path"]) for offset, title in pending]
                    pending, pos = [], located.end()
                more = plural and NEXT_ITEM.match(src.flat, pos)
                if not more:
                    break
                pos = more.end()
            found += [(src, offset, title, None) for offset, title in pending]
    return tuple(found)


def cited_files(path: str, citing: str) -> list[str]:
    """The files `in <path>`, written in `citing`, can mean."""
    if "/" not in path:
        return files_by_name().get(path, [])
    if path.split("/", 1)[0] in TOP_DIRS:
        return [path] if path in all_paths() else []
    near = (Path(citing).parent / path).as_posix()
    if near in all_paths():
        return [near]
    return [p for p in files_by_name().get(path.rsplit("/", 1)[-1], []) if p.endswith("/" + path)]


# --- paths in the text

REPO_PATH = re.compile(
    r"(?:\$\{\w*(?i:source_dir)\}/|(?<![\w./$@-]))(?P<path>(?:" + "|".join(TOP_DIRS) + r")/[\w./+-]*)"
)
PACKAGE_PATH = re.compile(r"(?<![\w./$@-])(?P<path>torch_openreg/[\w./+-]+)")
GLOB_NEXT = tuple("*<{[")


def path_tokens(src: Source):
    """(line, token, the repo paths it may be) of each repo path `src` names."""
    for i, line in enumerate(src.lines):
        for regex in (REPO_PATH, PACKAGE_PATH):
            for m in regex.finditer(line):
                token = m["path"].rstrip(".-")
                following = line[m.start("path") + len(token) :]
                if "*" in token or following.startswith(GLOB_NEXT):
                    continue  # a glob: src/*.rs, cpp/<interface>/
                path = token.rstrip("/")
                if regex is REPO_PATH:
                    if not (path + "/").startswith(tuple(p + "/" for p in PYTORCH_INCLUDE)):
                        yield i + 1, token, [path]
                    continue
                inner = path[len("torch_openreg/") :]
                if not inner.endswith(tuple("." + e for e in CITED_EXTS)):
                    continue  # a folder of the installed package: torch_openreg/include
                if inner.endswith(".rs.h"):
                    inner = inner[: -len(".h")]  # cxx's header of a Rust module
                if inner.split("/", 1)[0] in TOP_DIRS:
                    yield i + 1, token, [inner]  # an include path from the repo root
                else:
                    yield i + 1, token, [f"python/torch_openreg/{inner}", f"include/torch_openreg/{inner}"]


NAME = r"[A-Za-z_][\w-]*(?:\.[\w-]+)*\.(?:" + "|".join(CITED_EXTS) + r")"
BARE_NAME = re.compile(
    r"\bin\s+[`'\"]*(?<![\w./-])(?P<after_in>" + NAME + r")(?![\w/+-]|\.\w)|(?<![\w./-])\((?P<paren>" + NAME + r")\)"
)


# --- the tests


def _report(problems: list[str], what: str) -> str:
    return f"{len(problems)} {what}:\n  " + "\n  ".join(problems)


def test_the_scan_sees_the_tree():
    # Notes defined and cited in Rust, C++ and Python, some citing their file.
    assert {src.rel.rsplit(".", 1)[-1] for src in sources()} >= {"rs", "cpp", "h", "py", "md"}
    assert len(definitions()) >= 50, sorted(definitions())
    assert len(references()) >= 300
    assert sum(1 for *_, path in references() if path) >= 100


def test_every_referenced_note_is_defined():
    defined = definitions()
    problems = [
        f"{src.where(offset)}: Note [{title}] is defined nowhere"
        for src, offset, title, _ in references()
        if title not in defined
    ]
    assert not problems, _report(problems, "references to notes that do not exist")


def test_a_note_cited_in_a_file_is_defined_there():
    defined = definitions()
    problems = []
    for src, offset, title, path in references():
        if path is None or title not in defined:
            continue  # no file named, or the test above reports it
        candidates = cited_files(path, src.rel)
        if not candidates:
            problems.append(f"{src.where(offset)}: Note [{title}] in {path}: no such file")
        elif not defined[title] & set(candidates):
            problems.append(
                f"{src.where(offset)}: Note [{title}] in {path}: it is defined in {', '.join(sorted(defined[title]))}"
            )
    assert not problems, _report(problems, "notes cited in a file that does not define them")


def test_every_repo_path_named_exists():
    paths = all_paths()
    problems = [
        f"{src.rel}:{line}: {token} does not exist"
        for src in sources()
        for line, token, candidates in path_tokens(src)
        if not any(c in paths for c in candidates)
    ]
    assert not problems, _report(problems, "paths that name nothing")


def test_every_bare_file_name_cited_exists():
    by_name = files_by_name()
    problems = [
        f"{src.where(m.start(m.lastgroup))}: {m[m.lastgroup]}: no file of that name"
        for src in sources()
        for m in BARE_NAME.finditer(src.flat)
        if m[m.lastgroup] not in by_name and m[m.lastgroup] not in NOT_OURS
    ]
    assert not problems, _report(problems, "file names that name nothing")
