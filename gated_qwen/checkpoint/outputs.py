"""Write an output folder or file whole or not at all: the one mechanism every command that writes uses, under
the rules of the documentation's "Writing outputs" page (``docs/outputs.md``): staged in a folder its writer
locks (``flock``) on DST's file system, put in place by ``os.replace`` (or entry by entry into an existing DST,
old entries aside into a ``.old`` folder, undone on failure); what killed runs left (unlocked staging entries)
is removed by the next write in the same place, a ``.old`` folder reported. Not covered: power loss (no fsync).

>>> import tempfile
>>> root = Path(tempfile.mkdtemp())
>>> with OutputFolder(root / "result") as staging:   # DST checked when the object is made, before any work
...     _ = (staging / "numbers.json").write_text("[1, 2]")
...     (root / "result").exists()
False
>>> sorted(p.name for p in (root / "result").iterdir())   # renamed into place when the block ended
['numbers.json']
>>> OutputFolder(root / "result")  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
gated_qwen.checkpoint.outputs.OutputError: ... is not empty; choose another folder or pass --overwrite to replace it
"""

from __future__ import annotations

import errno
import os
import re
import secrets
import shutil
import tempfile
from collections import namedtuple
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from transformers.utils import logging

from ..errors import GatedQwenError


try:
    import fcntl
except ImportError:  # not POSIX: no lock, so no leftover is ever taken for a dead run's
    fcntl = None

logger = logging.get_logger(__name__)
LEFTOVER = re.compile(r"^\.(?P<name>.*)\.[^.]+\.gated-qwen\.(?P<state>partial|old|deleting)$")
# A staging entry found in a folder; status: "alive" (its writer holds its lock) or "gone"
Leftover = namedtuple("Leftover", "path state status")


class OutputError(GatedQwenError):
    """An output that cannot be written as asked: DST is a file, is not empty, or changed while writing."""


def _lock(path: Path) -> int | None:
    """A descriptor holding an exclusive lock on ``path``, None where another holds it. The kernel drops the lock
    when the process ends, however it ends: an unlocked staging entry is a dead run's."""
    fd = os.open(path, os.O_RDONLY)
    try:
        if fcntl is not None:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return fd
    except OSError:
        os.close(fd)
        return None


def _unlock(fd: int | None) -> None:
    if fd is not None:
        os.close(fd)


def _staging(parent: Path, name: str, state: str, folder: bool = True) -> tuple[Path, int | None]:
    """A new, locked staging folder (or file) in ``parent``. Made by a plain mkdir (or open), not tempfile's
    mkdtemp (mode 0700, which DST would keep): the mode the umask gives; the random part is mkdtemp's size."""
    path = parent / f".{name[:80]}.{secrets.token_hex(8)}.gated-qwen.{state}"
    if folder:
        path.mkdir()
    else:
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666))
    return path, _lock(path)


def find_leftovers(folder: str | os.PathLike) -> list[Leftover]:
    """The staging entries in ``folder``, each with whether its writer still runs (holds its lock).

    >>> find_leftovers("/nonexistent")
    []
    """
    found = []
    for path in sorted(Path(folder).glob(".*.gated-qwen.*")):
        if match := LEFTOVER.match(path.name):
            try:
                fd = _lock(path)
            except OSError:
                continue  # gone meanwhile
            _unlock(fd)
            found.append(Leftover(path, match["state"], "alive" if fd is None or fcntl is None else "gone"))
    return found


def remove_stale(folder: str | os.PathLike) -> list[Path]:
    """Remove the unlocked staging (``.partial``) and half-deleted (``.deleting``) entries killed runs left in
    ``folder``, warning about each; an unlocked ``.old`` folder (what a folder held before an interrupted
    replace) is reported, never removed. Returns the removed paths.

    >>> remove_stale("/nonexistent")
    []
    """
    removed = []
    for left in find_leftovers(folder):
        if left.status == "alive":
            continue  # a concurrent run's work in progress
        if left.state == "old":
            logger.warning(
                f"{left.path} holds what {left.path.parent} held before a replace that was interrupted; "
                f"check {left.path.parent}, then delete it or move its entries back"
            )
        elif (fd := _lock(left.path)) is not None:  # None: another run is cleaning it up
            shutil.rmtree(left.path, ignore_errors=True)  # a folder; a file (output_file's) is unlinked below
            left.path.unlink(missing_ok=True)
            _unlock(fd)
            removed.append(left.path)
            logger.warning(f"removed {left.path}, left by a gated-qwen run that was stopped while writing")
    return removed


def _entries(folder: Path) -> list[str]:
    """``folder``'s entries, without staging entries (which are not content)."""
    return sorted(name for name in os.listdir(folder) if not LEFTOVER.match(name))


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
    """DST as the user wrote it, with where it points when it is a link."""
    return f"{given} (a link to {resolved})" if given.is_symlink() else str(given)


class OutputFolder:
    """An output folder written whole or not at all (the module's example). Creating one checks DST (and removes
    what killed runs left), so a command fails before its long work; entering it (``with``, :meth:`open`) returns
    the staging folder to write into; leaving the block (:meth:`commit`) puts it in place, an exception
    (:meth:`discard`) leaves DST as it was. ``overwrite``: replace a DST that has entries. ``merge``: keep DST's
    other entries (``names``: the ones written, so that a clash is refused at once). ``advice``: what a refusal
    tells the user to do.
    """

    def __init__(
        self,
        destination: str | os.PathLike,
        *,
        overwrite: bool = False,
        merge: bool = False,
        names: Iterable[str] = (),
        advice: str = "choose another folder or pass --overwrite to replace it",
    ):
        self.given = Path(destination).expanduser()
        self.destination = resolve_destination(self.given)
        self.shown = _shown(self.given, self.destination)
        self.overwrite, self.merge, self.names, self.advice = overwrite, merge, set(names), advice
        self.path: Path | None = None  # the staging folder, while open
        self._fd: int | None = None  # its lock
        self._inside = False  # staging inside DST (DST existed) rather than beside it
        self._created: list[Path] = []  # parent folders made for a missing DST, deepest first
        remove_stale(self.destination.parent)
        if self.destination.is_dir():
            remove_stale(self.destination)
        self._check()

    def _check(self) -> None:
        dst = self.destination
        if dst.exists() and not dst.is_dir():
            raise OutputError(f"{self.shown} exists and is not a folder; give a folder to write into")
        present = set(_entries(dst)) if dst.is_dir() else set()
        clashing = sorted(present & self.names) if self.merge else sorted(present)
        if clashing and not self.overwrite:
            what = f"already holds {', '.join(clashing)}" if self.merge else "is not empty"
            raise OutputError(f"{self.shown} {what}; {self.advice}")
        cwd = Path.cwd().resolve()
        if clashing and not self.merge and dst in (Path.home().resolve(), cwd, *cwd.parents):
            raise OutputError(
                f"{self.shown} is the current folder, one that holds it, or the home folder; its contents are "
                "never replaced. Give a new folder"
            )

    def open(self) -> Path:
        """Create the staging folder and return it (what ``with`` does)."""
        if self.path is not None:
            raise RuntimeError(f"the output folder {self.destination} is already open")
        dst = self.destination
        self._check()  # again: DST may have changed since the object was made
        self._inside = dst.is_dir()
        try:
            if not self._inside:
                self._created = [p for p in (dst.parent, *dst.parent.parents) if not p.exists()]
                dst.parent.mkdir(parents=True, exist_ok=True)
            self.path, self._fd = _staging(dst if self._inside else dst.parent, dst.name, "partial")
        except OSError as error:
            self.discard()
            raise OutputError(
                f"cannot write {self.shown}: {error.strerror or error} ({error.filename or dst})"
            ) from error
        return self.path

    def discard(self) -> None:
        """Remove the staging folder (and parent folders this object made); DST stays as it was."""
        if self.path is not None:
            shutil.rmtree(self.path, ignore_errors=True)
            self.path = None
            _unlock(self._fd)
        for folder in self._created:
            try:
                folder.rmdir()
            except OSError:
                break
        self._created = []

    def commit(self) -> Path:
        """Put the staging folder's contents in place as DST; returns DST (the resolved path)."""
        if self.path is None:
            raise RuntimeError(f"the output folder {self.destination} is not open")
        try:
            if self._inside:
                self._move_in(self.path, self.destination)
            else:
                try:
                    os.replace(self.path, self.destination)  # one step; fails if DST appeared with entries meanwhile
                except OSError as error:
                    if error.errno not in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR, errno.EISDIR):
                        raise
                    raise OutputError(
                        f"{self.shown} was created by someone else while this run wrote it; nothing was replaced"
                    ) from error
        except BaseException:
            self.discard()
            raise
        _unlock(self._fd)
        self.path, self._created = None, []
        return self.destination

    def _move_in(self, staging: Path, dst: Path) -> None:
        """Move the staged entries into the existing DST, its old entries aside first; undo all on failure."""
        new, present = _entries(staging), _entries(dst)
        if not self.overwrite and (set(present) & set(new) or (present and not self.merge)):
            raise OutputError(f"{self.shown} was filled by someone else while this run wrote it; nothing was replaced")
        old = [name for name in present if not self.merge or name in new]
        trash, trash_fd = _staging(dst, dst.name, "old") if old else (None, None)
        moves = [(dst / name, trash / name) for name in old] + [(staging / name, dst / name) for name in new]
        done = []
        try:
            for source, target in moves:
                os.rename(source, target)
                done.append((source, target))
        except BaseException:
            for source, target in reversed(done):
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
        self.commit() if kind is None else self.discard()


@contextmanager
def output_file(path: str | os.PathLike, *, overwrite: bool = True) -> Iterator[Path]:
    """Yield a temporary path beside ``path``, which replaces ``path`` (or the file a link points to) in one
    ``os.replace`` when the block ends, or is removed on an exception. Without ``overwrite`` a file is refused.

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


@contextmanager
def scratch_folder(parent: str | os.PathLike | None = None, name: str = "scratch") -> Iterator[Path]:
    """A temporary folder in ``parent`` (default: the system's), removed on leaving the block, or if a killed
    process left it, by the next call.

    >>> with scratch_folder(name="bench") as scratch:
    ...     _ = (scratch / "stock.safetensors").write_bytes(b"")
    >>> scratch.exists()
    False
    """
    parent = Path(parent).expanduser() if parent is not None else Path(tempfile.gettempdir())
    parent.mkdir(parents=True, exist_ok=True)
    remove_stale(parent)
    path, fd = _staging(parent, name, "partial")
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
        _unlock(fd)
