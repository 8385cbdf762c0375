"""What git keeps in files, read without running git: HEAD's commit, a worktree's registration, the index's flags.

These run at every task's start and at every commit, several times an iteration, from up
to N task threads at once: a `git rev-parse` or `git worktree list` would be a process each
(milliseconds, in the burst of tasks starting together), and GitPython's readers resolve
every path they open. Each reader keeps to git's documented layouts (gitrepository-layout,
the "files" ref backend, index formats 2-4) and leaves anything else to git or GitPython,
or answers "may be" where the caller then asks git. A reftable repository's refs are asked of
git (ref_storage.py).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from orchestrator.ref_storage import REFTABLE_HEAD, commit_asked, is_reftable


def branches_held_by_operations(common: Path, exclude: Path | None = None) -> dict[str, tuple[Path, str]]:
    """Branches a rebase or a bisect in some worktree holds (`git branch -D` and `checkout` elsewhere
    refuse them), with that worktree's folder and what is under way. `git worktree list` shows such
    a worktree detached; git knows the branch from these files. `exclude`: a registration to leave out."""
    busy: dict[str, tuple[Path, str]] = {}
    for admin, folder in checkouts(common, exclude):
        for name, doing in (("rebase-merge/head-name", "rebase"), ("rebase-apply/head-name", "rebase"), ("BISECT_START", "bisect")):
            try:
                ref = (admin / name).read_text(encoding="utf-8", errors="replace").strip()
            except OSError:
                continue
            busy.setdefault(ref.removeprefix("refs/heads/"), (folder, doing))
    return busy


def checkouts(common: Path, exclude: Path | None = None) -> list[tuple[Path, Path]]:
    """(git dir, folder) of the repository's main checkout and of each registered worktree but `exclude`."""
    found = [(common, common.parent)]
    try:
        for admin in sorted((common / "worktrees").iterdir()):
            # The registrations' names are unique: only a same name needs resolving.
            if exclude is not None and admin.name == exclude.name and (admin == exclude or admin.resolve() == exclude.resolve()):
                continue
            link = os.fsdecode((admin / "gitdir").read_bytes()).strip()
            found.append((admin, (admin / link).parent))  # relative (worktree.useRelativePaths, git >= 2.48): to `admin`
    except OSError:
        pass
    return found


# A commit's full name: SHA-1, or SHA-256 in a repository made with --object-format=sha256.
OBJECT_NAME = re.compile(r"[0-9a-f]{40}(?:[0-9a-f]{24})?")


# Refs a linked worktree keeps in its own git dir (gitrepository-layout); the others are in the common dir.
_PER_WORKTREE_REFS = ("refs/bisect/", "refs/worktree/", "refs/rewritten/")


_SYMREF_DEPTH = 5  # git follows symbolic refs this deep


def head_commit(git_dir: Path, common: Path) -> str | None:
    """HEAD's commit, read from the ref files (git's "files" backend); None when HEAD names a branch with
    no commit yet.

    A few small reads: `git rev-parse` would be a process, and GitPython's reader resolves every
    path it opens (a dozen `lstat`s each), 0.2 ms, three times an iteration and under the GIL.
    Anything else (a ref that is not a name) is left to GitPython. A reftable repository, told by the
    placeholder its HEAD file holds (so the files backend pays nothing more), is asked of git.
    """
    name = "HEAD"
    try:
        for _ in range(_SYMREF_DEPTH):
            folder = git_dir if name == "HEAD" or name.startswith(_PER_WORKTREE_REFS) else common
            try:
                content = (folder / name).read_bytes().decode("ascii").strip()
            except FileNotFoundError:
                return _packed_ref(common, name)
            if not content.startswith("ref:"):
                if OBJECT_NAME.fullmatch(content):
                    return content
                break
            if name == "HEAD" and content == REFTABLE_HEAD and is_reftable(common):
                return commit_asked(git_dir, common=common)
            name = content.removeprefix("ref:").strip()
    except (OSError, UnicodeDecodeError):
        pass
    return _head_commit_by_gitpython(git_dir)


def broken_head_ref(git_dir: Path, common: Path) -> tuple[str, str] | None:
    """(its name, what it holds) when the ref HEAD leads to is there but holds no commit's name (`garbage`
    written into refs/heads/main, a file left empty by a crash); None when it holds one or is not there
    (a branch with no commit yet), and wherever the files do not say (a packed or another backend's ref)."""
    if is_reftable(common):
        return None  # a reftable holds object names only: no text to be garbage
    name = "HEAD"
    for _ in range(_SYMREF_DEPTH):
        folder = git_dir if name == "HEAD" or name.startswith(_PER_WORKTREE_REFS) else common
        try:
            content = (folder / name).read_bytes().decode("utf-8", "replace").strip()
        except OSError:
            return None
        if not content.startswith("ref:"):
            return None if OBJECT_NAME.fullmatch(content) else (name, content)
        name = content.removeprefix("ref:").strip()
    return None


def _packed_ref(common: Path, name: str) -> str | None:
    """`name`'s commit in packed-refs (lines `<object name> <ref>`), or None when it has none."""
    try:
        lines = (common / "packed-refs").read_bytes().decode("utf-8", "replace").splitlines()
    except FileNotFoundError:
        return None
    wanted = f" {name}"
    return next((line.split(" ", 1)[0] for line in lines if line.endswith(wanted) and not line.startswith(("#", "^"))), None)


def _head_commit_by_gitpython(git_dir: Path) -> str | None:
    import git
    from git.refs.symbolic import SymbolicReference

    try:
        return SymbolicReference.dereference_recursive(git.Repo(git_dir), "HEAD")
    except ValueError:  # HEAD names a branch with no commit yet, or a ref holding no object name
        return None
    except (AssertionError, IndexError):  # an empty ref file (a crash mid-write): GitPython asserts (or, under -O, indexes) on it
        return None


def is_worktree_of(repo, path: Path) -> bool:
    """Whether `path` is a worktree registered in `repo`, read from the two files that make the link.

    `path/.git` names the repository's `worktrees/<id>` folder, whose `gitdir` file names
    `path/.git` back; `git worktree list` reads the same files, at the cost of a process a task.
    """
    admin = linked_admin_dir(repo, path)
    return admin is not None and names_back(admin, path)


def admin_dir(path: Path, common: Path | None = None) -> Path | None:
    """The folder `<common>/worktrees/<id>` that registers the worktree at `path` (its `gitdir` file names `path/.git`).

    Read from `path/.git` when that link is intact (two small files). When the agent deleted or
    rewrote it, found by the registration's own back link: in `common` if given, else in the
    repository the broken link names or the one above `path` (where git's discovery would go).
    """
    link = gitdir_link(path)
    if link is not None and names_back(link, path) and (common is None or link.resolve().parent == common.resolve() / "worktrees"):
        return link
    if not path.is_dir():
        return None  # a folder removed altogether is registered anew (after `git worktree prune`)
    candidates = [common] if common is not None else [common_of(gitdir) for gitdir in (link, _gitdir_above(path)) if gitdir]
    for candidate in candidates:
        try:
            registered = sorted((candidate / "worktrees").iterdir())
        except OSError:
            continue
        found = next((admin for admin in registered if names_back(admin, path)), None)
        if found is not None:
            return found
    return None


def admin_dir_for_recovery(path: Path, configured: Path) -> Path | None:
    """`admin_dir(path)` (the intact link's registration, else one in the repository the broken link names or the one
    above `path`), else the registration in `configured`, the configured repository's common dir.

    That one last: an intact link to another repository's registration (a copy of the repository registers its
    worktrees too) stays with that repository. Needed for a link the agent broke in a state dir kept outside the
    checkout: no repository is above its worktrees, and the link names none, so recovery failed every later night."""
    return admin_dir(path) or admin_dir(path, configured)


# Past this many entries the index is read by `git ls-files` instead (a process beats Python's loop).
_INDEX_ENTRIES_READ_HERE = 5000


_ASSUME_VALID, _EXTENDED, _SKIP_WORKTREE = 0x8000, 0x4000, 0x4000  # flags, flags, extended flags


def index_may_hide_files(index: Path) -> bool:
    """Whether an entry of the index (git's format 2-4) may carry assume-unchanged or skip-worktree:
    False only when read and none does; a large or unknown index is left to git."""
    try:
        data = index.read_bytes()
    except OSError:
        return False  # no index: nothing hidden
    version, count = int.from_bytes(data[4:8], "big"), int.from_bytes(data[8:12], "big")
    if data[:4] != b"DIRC" or version not in (2, 3, 4) or count > _INDEX_ENTRIES_READ_HERE:
        return True
    at = 12
    try:
        for _ in range(count):
            flags = int.from_bytes(data[at + 60 : at + 62], "big")
            header = 62
            if flags & _ASSUME_VALID:
                return True
            if flags & _EXTENDED:
                if int.from_bytes(data[at + 62 : at + 64], "big") & _SKIP_WORKTREE:
                    return True
                header = 64
            if version == 4:  # the name's shared prefix length (a varint), then the rest of the name, NUL-ended
                at += header
                while data[at] & 0x80:
                    at += 1
                at = data.index(b"\0", at + 1) + 1
            else:  # the name NUL-padded to a multiple of eight bytes
                name_length = data.index(b"\0", at + header) - at - header
                at += (header + name_length + 8) & ~7
    except (IndexError, ValueError):
        return True
    return False


def names_back(admin: Path, path: Path) -> bool:
    """Whether the registration folder `admin` names `path/.git` as its worktree's link."""
    try:
        back = admin / os.fsdecode((admin / "gitdir").read_bytes()).strip()  # relative: to `admin`
    except OSError:
        return False
    # The folder resolved, not `.git` itself: a `.git` the agent made a symlink must not lead elsewhere.
    return back.name == ".git" and (back.parent == path or back.parent.resolve() == path.resolve())


def common_of(gitdir: Path) -> Path:
    """The common dir of a git dir: what its `commondir` file names (a linked worktree's), else itself."""
    try:
        return (gitdir / os.fsdecode((gitdir / "commondir").read_bytes()).strip()).resolve()
    except OSError:
        return gitdir.resolve()


def _gitdir_above(path: Path) -> Path | None:
    """The git dir git's discovery would find from `path`'s parent folder, if any."""
    for folder in path.resolve().parents:
        dotgit = folder / ".git"
        if dotgit.is_dir():
            return dotgit
        if dotgit.exists():
            return gitdir_link(folder)
    return None


def linked_admin_dir(repo, path: Path) -> Path | None:
    """The folder in `repo`'s own `worktrees/` (git's, in the .git dir) that `path/.git` links to, if it links to one there."""
    admin = gitdir_link(path)
    return admin if admin is not None and admin.resolve().parent == Path(repo.common_dir).resolve() / "worktrees" else None


def gitdir_link(path: Path) -> Path | None:
    """The git dir that `path/.git` names, when that is a linked worktree's link file; else None."""
    try:
        # os.fsdecode: git writes paths as the file system's bytes, which need not be UTF-8.
        link = os.fsdecode((path / ".git").read_bytes()).strip()
    except OSError:  # missing, or a folder: not a linked worktree
        return None
    if not link.startswith("gitdir:"):
        return None
    gitdir = Path(link.removeprefix("gitdir:").strip())
    return gitdir if gitdir.is_absolute() else path / gitdir


def is_git(name: str) -> bool:
    """Whether a file name is .git's, the one name the tools never show nor touch: on a case-insensitive file system
    (macOS, Windows) .GIT is .git too."""
    return name.casefold() == ".git"
