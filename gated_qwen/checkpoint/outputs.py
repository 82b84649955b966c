"""Write an output folder or file whole or not at all: the one mechanism every command that writes uses.

``convert``, ``train`` (its ``--out``, checkpoints, ``final/``, ``summary.json``), ``analyze`` and ``bench``
write through :class:`OutputFolder` (a folder) or :func:`output_file` / :func:`write_text` (a file); a new
command does the same (the example below). The rules, which the documentation's "Writing outputs" page
(``docs/outputs.md``) states once for all commands:

* **Where.** DST is resolved first: ``~``, a relative path, ``.``, and symbolic links. A link (also one
  that points nowhere yet) is followed: the output is written where it points, and the link itself is
  never replaced. A link loop is refused before anything is written.
* **What may be there.** DST may be missing or an empty folder. A folder with entries is refused, unless
  ``overwrite``, which replaces its contents. A file is always refused, and so is replacing the
  contents of the current folder, a folder that holds it, or the home folder (an empty one is fine).
* **How.** Everything is written into a staging folder (``tempfile.mkdtemp`` on DST's own file system)
  and put in place only when the command has finished it. For a missing DST the staging folder lies
  beside it and becomes DST in one ``os.replace``. An existing DST is kept as it is (the same folder, so a
  shell sitting in it, a link to it, a mount point, its owner and mode all stay valid): the staging folder
  lies inside it, and at the end its old entries are moved into a folder of their own, the new ones are
  moved up, and the old ones are deleted. If a move fails, those already made are undone.
* **Leftovers.** A staging folder is named ``.NAME.XXXXXXXX.gated-qwen.partial`` and its writer holds a
  lock on it (``flock``) while it runs; the kernel drops the lock when the writer ends, however it ends.
  Whenever a command is about to write DST, unlocked staging folders beside DST or inside it (left by a
  killed run) are removed, with a warning naming them; locked ones (a concurrent run) are left alone. A
  ``.old`` folder left unlocked holds what DST held when its writer died in the middle of the final moves:
  it is reported, never removed.

Not covered: power loss (files are not fsync'ed), and file systems without ``flock`` (some network file
systems), where leftovers are reported and left for the user to delete.

>>> import tempfile
>>> from pathlib import Path
>>> root = Path(tempfile.mkdtemp())
>>> output = OutputFolder(root / "result")           # checks DST now, before any long work
>>> with output as staging:                          # a folder beside DST; DST does not exist yet
...     _ = (staging / "numbers.json").write_text("[1, 2]")
...     (root / "result").exists()
False
>>> sorted(p.name for p in (root / "result").iterdir())   # renamed into place when the block ended
['numbers.json']
>>> OutputFolder(root / "result")  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
gated_qwen.checkpoint.outputs.OutputError: ... is not empty; choose another folder or pass --overwrite to replace it
>>> write_text(root / "result" / "notes.txt", "whole or absent")  # doctest: +ELLIPSIS
PosixPath('.../result/notes.txt')
>>> shutil.rmtree(root)
"""

from __future__ import annotations

import errno
import os
import re
import secrets
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from transformers.utils import logging

from ..errors import GatedQwenError


try:
    import fcntl
except ImportError:  # not POSIX: no lock, so no leftover is ever taken for a dead run's
    fcntl = None

logger = logging.get_logger(__name__)

OWNER_TAG = "gated-qwen"
NAME_KEPT = 80  # characters of DST's name kept in a staging name (a file name has at most 255)
STATES = ("partial", "old", "deleting")
LEFTOVER = re.compile(rf"^\.(?P<name>.*)\.[^.]+\.{OWNER_TAG}\.(?P<state>{'|'.join(STATES)})$")
DEFAULT_ADVICE = "choose another folder or pass --overwrite to replace it"


class OutputError(GatedQwenError):
    """An output that cannot be written as asked: DST is a file, is not empty, or changed while writing."""


# ----------------------------------------------------------------------------------------------
# Staging entries, locked by their writer while it runs


def _lock(path: Path) -> int | None:
    """Open ``path`` and hold an exclusive lock on it; the descriptor (None where it is already locked).

    The lock lives as long as the descriptor, which the kernel closes when the process ends, killed too:
    an unlocked staging entry is a dead run's, with no process id to check or to be reused.
    """
    fd = os.open(path, os.O_RDONLY)
    if fcntl is None:
        return fd
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    return fd


def _unlock(fd: int | None) -> None:
    if fd is not None:
        os.close(fd)


def _staging(parent: Path, name: str, state: str, folder: bool = True) -> tuple[Path, int]:
    """A new, locked staging folder (or file) in ``parent``, with the mode a plain mkdir (or open) gives."""
    prefix, suffix = f".{name[:NAME_KEPT]}.", f".{OWNER_TAG}.{state}"
    if folder:
        path = Path(tempfile.mkdtemp(dir=parent, prefix=prefix, suffix=suffix))
    else:
        handle, made = tempfile.mkstemp(dir=parent, prefix=prefix, suffix=suffix)
        os.close(handle)
        path = Path(made)
    os.chmod(path, _plain_mode(parent) & (0o777 if folder else 0o666))  # not mkdtemp's 0600/0700: it becomes DST's
    return path, _lock(path)


def _plain_mode(parent: Path) -> int:
    """``0o777`` less the process's umask, read from a folder made and removed in ``parent``: ``os.umask`` can only
    be read by setting it, which would change it for every thread meanwhile."""
    probe = parent / f".mode.{secrets.token_hex(4)}.{OWNER_TAG}.partial"  # a leftover like any, if killed here
    probe.mkdir()  # a plain mkdir: the mode the umask leaves
    try:
        return probe.stat().st_mode & 0o777
    finally:
        probe.rmdir()


@dataclass
class Leftover:
    """A staging, replaced or being-deleted folder (or file) this module made, found by its name."""

    path: Path
    state: str
    status: str  # "alive" (its writer holds its lock) or "gone"


def find_leftovers(folder: str | os.PathLike) -> list[Leftover]:
    """The staging entries in ``folder``, each with whether its writer still runs (holds its lock).

    >>> find_leftovers("/nonexistent")
    []
    """
    folder = Path(folder)
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return []
    found = []
    for name in names:
        match = LEFTOVER.match(name)
        if match is None:
            continue
        try:
            fd = _lock(folder / name)
        except OSError:
            continue  # gone meanwhile
        status = "alive" if fd is None or fcntl is None else "gone"
        _unlock(fd)
        found.append(Leftover(folder / name, match["state"], status))
    return found


def remove_stale(folder: str | os.PathLike) -> list[Path]:
    """Remove what killed runs left in ``folder``; warn about each removal, and about what is kept.

    Unlocked staging (``.partial``) and half-deleted (``.deleting``) entries are removed. An unlocked
    ``.old`` folder holds a folder's earlier contents from an interrupted replace: it is reported, never
    removed. Returns the removed paths.

    >>> remove_stale("/nonexistent")
    []
    """
    removed = []
    for leftover in find_leftovers(folder):
        if leftover.status == "alive":
            continue  # a concurrent run's work in progress
        if leftover.state == "old":
            logger.warning(
                f"{leftover.path} holds what {leftover.path.parent} held before a replace that was interrupted; "
                f"check {leftover.path.parent}, then delete it or move its entries back"
            )
            continue
        fd = _lock(leftover.path)
        if fd is None:
            continue  # taken by another run that is cleaning up too
        try:
            _remove(leftover.path)
        finally:
            _unlock(fd)
        removed.append(leftover.path)
        logger.warning(f"removed {leftover.path}, left by a gated-qwen run that was stopped while writing")
    return removed


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def _entries(folder: Path) -> list[str]:
    """``folder``'s entries, without this module's staging entries (which are not content)."""
    return sorted(name for name in os.listdir(folder) if not LEFTOVER.match(name))


# ----------------------------------------------------------------------------------------------
# Where DST really is


def resolve_destination(path: str | os.PathLike) -> Path:
    """The absolute path DST stands for, links followed: where the output will be written.

    >>> resolve_destination(".") == Path.cwd().resolve()
    True
    """
    given = Path(path).expanduser()
    try:
        return given.resolve(strict=False)
    except (RuntimeError, OSError) as error:  # a link loop: RuntimeError before Python 3.13, OSError after
        raise OutputError(
            f"{given} cannot be resolved ({error}); it is a symbolic link that points to itself"
        ) from error


def _shown(given: Path, resolved: Path) -> str:
    """DST as the user wrote it, with where it points when that is elsewhere (a link)."""
    if given.is_symlink():
        return f"{given} (a link to {resolved})"
    return str(given)


def _protected(folder: Path) -> bool:
    """True for folders whose contents are never replaced: the current folder, its parents, the home folder."""
    cwd = Path.cwd().resolve()
    return folder == Path.home().resolve() or cwd == folder or folder in cwd.parents


# ----------------------------------------------------------------------------------------------
# Folders


class OutputFolder:
    """An output folder that is written whole or not at all (see the module docstring for the rules).

    Creating one checks DST and removes what killed runs left beside it, so a command fails before
    its long work, not after. Entering it (``with``, or :meth:`open`) creates the staging folder and
    returns its path: write everything there. Leaving the block without an exception (or
    :meth:`commit`) puts the contents in place; an exception (or :meth:`discard`) removes the staging
    folder and leaves DST as it was.

    ``overwrite``: replace a DST that has entries (refused otherwise). ``merge``: DST may hold other
    entries, which are kept; only the written entries replace their namesakes, and only with
    ``overwrite``; ``names`` lists them in advance so that a clash is refused at once.
    ``advice`` is what the refusal of a non-empty DST tells the user to do.

    >>> import tempfile
    >>> root = Path(tempfile.mkdtemp())
    >>> (root / "run").mkdir(); _ = (root / "run" / "log.csv").write_text("kept")
    >>> with OutputFolder(root / "run", overwrite=True, merge=True, names=["summary.json"]) as staging:
    ...     _ = (staging / "summary.json").write_text("{}")
    >>> sorted(p.name for p in (root / "run").iterdir())
    ['log.csv', 'summary.json']
    >>> with OutputFolder(root / "other") as staging:
    ...     raise ValueError("failed halfway")
    Traceback (most recent call last):
    ...
    ValueError: failed halfway
    >>> (root / "other").exists(), sorted(p.name for p in root.iterdir())
    (False, ['run'])
    >>> shutil.rmtree(root)
    """

    def __init__(
        self,
        destination: str | os.PathLike,
        *,
        overwrite: bool = False,
        merge: bool = False,
        names: Iterable[str] = (),
        advice: str = DEFAULT_ADVICE,
    ):
        self.given = Path(destination).expanduser()
        self.destination = resolve_destination(self.given)
        self.overwrite, self.merge, self.names, self.advice = overwrite, merge, set(names), advice
        self.path: Path | None = None  # the staging folder, while open
        self._fd: int | None = None  # the staging folder's lock, while open
        self._inside = False  # staging inside DST (DST existed) rather than beside it
        self._created: list[Path] = []  # parent folders made for a missing DST, removed again on discard
        remove_stale(self.destination.parent)
        if self.destination.is_dir():
            remove_stale(self.destination)
        self._check(self.names)

    def __repr__(self) -> str:
        return f"OutputFolder({str(self.destination)!r})"

    @property
    def shown(self) -> str:
        return _shown(self.given, self.destination)

    def _check(self, names: set[str]) -> None:
        dst = self.destination
        if dst.exists() and not dst.is_dir():
            raise OutputError(f"{self.shown} exists and is not a folder; give a folder to write into")
        if not dst.is_dir():
            return
        present = set(_entries(dst))
        clashing = sorted(present & names) if self.merge else sorted(present)
        if not clashing:
            return
        if not self.overwrite:
            if self.merge:
                raise OutputError(f"{self.shown} already holds {', '.join(clashing)}; {self.advice}")
            raise OutputError(f"{self.shown} is not empty; {self.advice}")
        if not self.merge and _protected(dst):
            raise OutputError(
                f"{self.shown} is the current folder, one that holds it, or the home folder; its contents are "
                "never replaced. Give a new folder"
            )

    def open(self) -> Path:
        """Create the staging folder and return it (what ``with`` does)."""
        if self.path is not None:
            raise RuntimeError(f"{self!r} is already open")
        dst = self.destination
        self._check(self.names)  # again: DST may have changed since the object was made
        self._inside = dst.is_dir()
        try:
            if not self._inside:
                self._make_parents(dst.parent)
            self.path, self._fd = _staging(dst if self._inside else dst.parent, dst.name, "partial")
        except OSError as error:
            self.path = None
            self._remove_parents()
            raise OutputError(
                f"cannot write {self.shown}: {error.strerror or error} ({error.filename or dst})"
            ) from error
        return self.path

    def _make_parents(self, parent: Path) -> None:
        missing = []
        while not parent.exists():
            missing.append(parent)
            parent = parent.parent
        for folder in reversed(missing):
            folder.mkdir()
            self._created.append(folder)

    def _remove_parents(self) -> None:
        for folder in reversed(self._created):
            try:
                folder.rmdir()
            except OSError:
                break
        self._created = []

    def discard(self) -> None:
        """Remove the staging folder (and parent folders this object made); DST stays as it was."""
        if self.path is not None:
            shutil.rmtree(self.path, ignore_errors=True)
            self.path = None
            _unlock(self._fd)
        self._remove_parents()

    def commit(self) -> Path:
        """Put the staging folder's contents in place as DST; returns DST (the resolved path)."""
        if self.path is None:
            raise RuntimeError(f"{self!r} is not open")
        staging, dst = self.path, self.destination
        try:
            if not self._inside:
                try:
                    os.replace(staging, dst)  # one atomic step; fails if DST appeared with entries meanwhile
                except OSError as error:
                    if error.errno not in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR, errno.EISDIR):
                        raise
                    raise OutputError(
                        f"{self.shown} was created by someone else while this run wrote it; nothing was replaced"
                    ) from error
            else:
                self._move_in(staging, dst)
        except BaseException:
            self.discard()
            raise
        _unlock(self._fd)
        self.path, self._created = None, []
        return dst

    def _move_in(self, staging: Path, dst: Path) -> None:
        """Move the staged entries into the existing DST, its old entries aside first; undo all on failure."""
        new = _entries(staging)
        if not self.overwrite:
            present = set(_entries(dst))
            if present & set(new) or (present and not self.merge):
                raise OutputError(
                    f"{self.shown} was filled by someone else while this run wrote it; nothing was replaced"
                )
        old = [name for name in _entries(dst) if not self.merge or name in new]
        trash, trash_fd = _staging(dst, dst.name, "old") if old else (None, None)
        moves: list[tuple[Path, Path]] = []  # (from, to), in the order made
        try:
            if old:
                for name in old:
                    os.rename(dst / name, trash / name)
                    moves.append((dst / name, trash / name))
            for name in new:
                os.rename(staging / name, dst / name)
                moves.append((staging / name, dst / name))
        except BaseException:
            for source, target in reversed(moves):
                os.rename(target, source)
            if old:
                trash.rmdir()
                _unlock(trash_fd)
            raise
        staging.rmdir()
        if old:
            deleting = trash.with_name(trash.name.removesuffix(".old") + ".deleting")
            os.rename(trash, deleting)  # from here on it is garbage, whatever happens next (the lock moves with it)
            shutil.rmtree(deleting, ignore_errors=True)
            _unlock(trash_fd)

    def __enter__(self) -> Path:
        return self.open()

    def __exit__(self, kind, value, traceback) -> None:
        if kind is None:
            self.commit()
        else:
            self.discard()


# ----------------------------------------------------------------------------------------------
# Files


@contextmanager
def output_file(path: str | os.PathLike, *, overwrite: bool = True) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; on leaving the block it replaces ``path`` in one ``os.replace``.

    ``path`` as a link: the file it points to is replaced, the link is kept. Without ``overwrite`` an
    existing file is refused. On an exception the temporary file is removed and ``path`` is untouched.

    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as root:
    ...     with output_file(Path(root) / "summary.json") as partial:
    ...         _ = partial.write_text('{"steps": 12}')
    ...     (Path(root) / "summary.json").read_text()
    '{"steps": 12}'
    """
    given = Path(path).expanduser()
    target = resolve_destination(given)
    if target.is_dir():
        raise OutputError(f"{_shown(given, target)} is a folder; a file was to be written there")
    if target.exists() and not overwrite:
        raise OutputError(f"{_shown(given, target)} exists; pass --overwrite to replace it")
    remove_stale(target.parent)
    target.parent.mkdir(parents=True, exist_ok=True)
    partial, fd = _staging(target.parent, target.name, "partial", folder=False)
    try:
        yield partial
        os.replace(partial, target)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    finally:
        _unlock(fd)


def write_text(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` so that ``path`` holds either its old or its new text, never part of one.

    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as root:
    ...     write_text(Path(root) / "train_args.json", "{}").read_text()
    '{}'
    """
    with output_file(path) as partial:
        partial.write_text(text, encoding="utf-8")
    return resolve_destination(path)


# ----------------------------------------------------------------------------------------------
# Scratch


@contextmanager
def scratch_folder(parent: str | os.PathLike | None = None, name: str = "scratch") -> Iterator[Path]:
    """A temporary folder in ``parent`` (default: the system's temporary folder), removed on leaving the block.

    Unlike :class:`tempfile.TemporaryDirectory`, one that a killed process left behind is removed by
    the next call with the same ``parent`` (it is unlocked once its owner is gone, as a staging folder is).

    >>> with scratch_folder(name="bench") as scratch:
    ...     _ = (scratch / "stock.safetensors").write_bytes(b"")
    >>> scratch.exists()
    False
    """
    import tempfile

    parent = Path(parent).expanduser() if parent is not None else Path(tempfile.gettempdir())
    parent.mkdir(parents=True, exist_ok=True)
    remove_stale(parent)
    path, fd = _staging(parent, name, "partial")
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
        _unlock(fd)


__all__ = [
    "Leftover",
    "OutputError",
    "OutputFolder",
    "find_leftovers",
    "output_file",
    "remove_stale",
    "resolve_destination",
    "scratch_folder",
    "write_text",
]
