"""Which code made a dataset: the package's version, and the git commit when it runs from a
checkout (a release's install has no ``.git``; then the commit is absent, not guessed).

Read once per process: a test's two runs (or a rerun in the same driver) record the same
commit even when the checkout moves between them, and the driver pays one small file read."""

from __future__ import annotations

import functools
from importlib import metadata
from pathlib import Path
from typing import Any

#: the distribution whose version is recorded
PACKAGE = "shardflow"


@functools.cache
def code_version() -> dict[str, Any]:
    """``{"package", "version"[, "git_commit"]}`` for the manifest's ``lineage.code``."""
    out: dict[str, Any] = {"package": PACKAGE, "version": _version()}
    commit = git_commit(Path(__file__).resolve().parents[2])
    if commit:
        out["git_commit"] = commit
    return out


def _version() -> str:
    try:
        return metadata.version(PACKAGE)
    except metadata.PackageNotFoundError:
        return "unknown"


def git_commit(root: Path) -> str | None:
    """The commit ``root``'s checkout is at, read from ``.git`` (no ``git`` process: a worker
    image may not have one): ``HEAD``, a ref it names, or that ref in ``packed-refs``."""
    git = root / ".git"
    if git.is_file():  # a worktree: "gitdir: <path>"
        text = git.read_text(errors="replace").strip()
        if not text.startswith("gitdir:"):
            return None
        git = (root / text.partition(":")[2].strip()).resolve()
    try:
        head = (git / "HEAD").read_text().strip()
    except OSError:
        return None
    if not head.startswith("ref:"):
        return head if _is_sha(head) else None
    ref = head.partition(":")[2].strip()
    common = git
    if (git / "commondir").is_file():  # a worktree's refs live in the main checkout
        common = (git / (git / "commondir").read_text().strip()).resolve()
    for where in (git, common):
        try:
            sha = (where / ref).read_text().strip()
            if _is_sha(sha):
                return sha
        except OSError:
            pass
    try:
        for line in (common / "packed-refs").read_text().splitlines():
            sha, _, name = line.partition(" ")
            if name == ref and _is_sha(sha):
                return sha
    except OSError:
        pass
    return None


def _is_sha(text: str) -> bool:
    return len(text) in (40, 64) and all(c in "0123456789abcdef" for c in text)
