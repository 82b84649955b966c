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
* **How.** Everything is written into a staging folder first, and put in place only when the command
  has finished it. For a missing DST the staging folder lies beside it and becomes DST in one
  ``rename``. An existing DST is kept as it is (the same folder, so a shell sitting in it, a link to it,
  a mount point, its owner and mode all stay valid): the staging folder lies inside it, and at the
  end its old entries are moved into a folder of their own, the new ones are moved up, and the old
  ones are deleted. Staging always lies on DST's own file system, so every move is a ``rename``. If a
  move fails, those already made are undone and DST holds what it held before.
* **Leftovers.** A staging folder's name carries its owner: ``.NAME.gated-qwen-PID-START-HOST-XXXXXX.partial``
  (process id, the process's start time, a hash of the host name). Whenever a command is about to write
  DST, staging folders of owners that are gone (killed while writing), beside DST or inside it, are
  removed, with a warning that names them; those of a live process (a concurrent run) are left
  alone, and those from another host, whose owner cannot be checked, are only reported. One case is
  reported, not removed: a ``.old`` folder, which holds what DST held when its owner died in the middle
  of the final moves (a few renames, but not nothing): it says which folder to check.

Not covered: power loss. Files are not fsync'ed; the guarantees are against processes that fail,
are interrupted or are killed, and against concurrent runs.

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
import hashlib
import os
import re
import secrets
import shutil
import socket
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from transformers.utils import logging

from ..errors import GatedQwenError


logger = logging.get_logger(__name__)

OWNER_TAG = "gated-qwen"
NAME_KEPT = 80  # characters of DST's name kept in a staging name (a file name has at most 255)
STATES = ("partial", "old", "deleting")
LEFTOVER = re.compile(
    rf"^\.(?P<name>.*)\.{OWNER_TAG}-(?P<pid>\d+)-(?P<start>\d+)-(?P<host>[0-9a-f]{{8}})-(?P<token>[0-9a-f]{{6}})"
    rf"\.(?P<state>{'|'.join(STATES)})$"
)
DEFAULT_ADVICE = "choose another folder or pass --overwrite to replace it"


class OutputError(GatedQwenError):
    """An output that cannot be written as asked: DST is a file, is not empty, or changed while writing."""


# ----------------------------------------------------------------------------------------------
# Owners: who made a staging folder, and whether that process still runs


_PROC = os.path.exists("/proc/self/stat")


def _host_hash() -> str:
    return hashlib.sha1(socket.gethostname().encode()).hexdigest()[:8]


def _start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (Linux), 0 where unknown, None if it is gone.

    Together with the pid it names one process: a pid reused after a kill has another start time.
    """
    if not _PROC:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except OSError:
            pass  # exists, owned by someone else
        return 0
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except FileNotFoundError:
        return None
    except OSError:
        return 0
    if fields[0] in ("Z", "X"):
        return None  # a zombie has stopped writing for good
    return int(fields[19])


def _owner() -> str:
    pid = os.getpid()
    return f"{OWNER_TAG}-{pid}-{_start_time(pid) or 0}-{_host_hash()}-{secrets.token_hex(3)}"


def _leftover_name(name: str, owner: str, state: str) -> str:
    return f".{name[:NAME_KEPT]}.{owner}.{state}"


@dataclass
class Leftover:
    """A staging, replaced or being-deleted folder (or file) this module made, found by its name."""

    path: Path
    pid: int
    state: str
    status: str  # "alive", "gone" or "elsewhere" (another host: cannot be checked)


def find_leftovers(folder: str | os.PathLike) -> list[Leftover]:
    """The staging folders and files in ``folder`` (not below it), with whether their owners still run.

    >>> find_leftovers("/nonexistent")
    []
    """
    folder, found = Path(folder), []
    try:
        names = os.listdir(folder)
    except (FileNotFoundError, NotADirectoryError, PermissionError):
        return found
    host = _host_hash()
    for name in names:
        match = LEFTOVER.match(name)
        if match is None:
            continue
        pid, start = int(match["pid"]), int(match["start"])
        if match["host"] != host:
            status = "elsewhere"
        else:
            now = _start_time(pid)
            status = "gone" if now is None or (start and now and now != start) else "alive"
        found.append(Leftover(folder / name, pid, match["state"], status))
    return found


def remove_stale(folder: str | os.PathLike) -> list[Path]:
    """Remove what killed runs left in ``folder``; warn about each removal, and about what is kept.

    Staging (``.partial``) and half-deleted (``.deleting``) folders of owners that are gone are removed.
    A ``.old`` folder of a gone owner holds a folder's earlier contents from an interrupted replace: it
    is reported, never removed. Leftovers of another host are reported. Returns the removed paths.

    >>> remove_stale("/nonexistent")
    []
    """
    removed = []
    for leftover in find_leftovers(folder):
        if leftover.status == "alive":
            continue  # a concurrent run's work in progress
        if leftover.status == "elsewhere":
            logger.warning(
                f"{leftover.path} was left by process {leftover.pid} on another host; delete it if that run is over"
            )
        elif leftover.state == "old":
            logger.warning(
                f"{leftover.path} holds what {leftover.path.parent} held before a replace that was interrupted "
                f"(process {leftover.pid} is gone); check {leftover.path.parent}, then delete it or move its entries back"
            )
        else:
            _remove(leftover.path)
            removed.append(leftover.path)
            logger.warning(
                f"removed {leftover.path}, left by gated-qwen process {leftover.pid}, which was stopped while writing"
            )
    return removed


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def _entries(folder: Path) -> list[str]:
    """``folder``'s entries, without this module's staging folders (which are not content)."""
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
        owner = _owner()
        self._owner = owner
        try:
            if self._inside:
                self.path = dst / _leftover_name(dst.name, owner, "partial")
            else:
                self._make_parents(dst.parent)
                self.path = dst.parent / _leftover_name(dst.name, owner, "partial")
            self.path.mkdir()  # not tempfile.mkdtemp: its 0700 mode would become DST's
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
        self._remove_parents()

    def commit(self) -> Path:
        """Put the staging folder's contents in place as DST; returns DST (the resolved path)."""
        if self.path is None:
            raise RuntimeError(f"{self!r} is not open")
        staging, dst = self.path, self.destination
        try:
            if not self._inside:
                try:
                    os.rename(staging, dst)  # one atomic step; fails if DST appeared with entries meanwhile
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
        trash = dst / _leftover_name(dst.name, self._owner, "old")
        moves: list[tuple[Path, Path]] = []  # (from, to), in the order made
        try:
            if old:
                trash.mkdir()
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
            raise
        staging.rmdir()
        if old:
            deleting = trash.with_name(_leftover_name(dst.name, self._owner, "deleting"))
            os.rename(trash, deleting)  # from here on it is garbage, whatever happens next
            shutil.rmtree(deleting, ignore_errors=True)

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
    partial = target.parent / _leftover_name(target.name, _owner(), "partial")
    try:
        yield partial
        os.replace(partial, target)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise


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
    the next call with the same ``parent`` (its name carries its owner, as a staging folder's does).

    >>> with scratch_folder(name="bench") as scratch:
    ...     _ = (scratch / "stock.safetensors").write_bytes(b"")
    >>> scratch.exists()
    False
    """
    import tempfile

    parent = Path(parent).expanduser() if parent is not None else Path(tempfile.gettempdir())
    parent.mkdir(parents=True, exist_ok=True)
    remove_stale(parent)
    path = parent / _leftover_name(name, _owner(), "partial")
    path.mkdir()
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


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
