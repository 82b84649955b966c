"""Shared by the measuring scripts: what machine and versions a result was measured with, and writing it.

A measurement lives in ``results/<topic>/`` as ``results.json`` (every number, the command, the machine)
and ``results.md`` (the table the documentation includes), both written by the script that measured it.
Imports neither torch nor transformers (the versions come from the installed distributions), so that a
script timing start-up can use it too.
"""

from __future__ import annotations

import datetime
import os
import platform
import re
import shlex
import subprocess
import sys
import tempfile
from importlib import metadata
from pathlib import Path


ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("torch", "transformers", "safetensors", "accelerate", "huggingface_hub")


def _version(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def package_versions() -> dict[str, str | None]:
    """Versions of gated-qwen and the packages its measurements depend on (None: not installed)."""
    versions = {name: _version(name) for name in PACKAGES}
    gated_qwen = _version("gated-qwen")
    if gated_qwen is None:  # run from a checkout on PYTHONPATH: the package's own version (a torch-free import)
        sys.path.insert(0, str(ROOT))
        import gated_qwen

        gated_qwen = gated_qwen.__version__
    return {"gated-qwen": gated_qwen, **versions}


def machine() -> dict:
    """CPU model, cores, memory, OS, Python, the load average now, and the time (UTC)."""
    cpu = platform.processor() or platform.machine()
    memory_gb = None
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                memory_gb = round(int(line.split()[1]) / 1024**2, 1)
                break
    except OSError:
        pass
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gb": memory_gb,
        "os": platform.platform(),
        "python": platform.python_version(),
        "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


def git_commit(checkout: str | os.PathLike = ROOT) -> str | None:
    """The commit ``checkout`` (by default this repository) has checked out; None outside git."""
    result = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=checkout, check=False)
    return result.stdout.strip() or None


# An absolute path outside the repository (a temporary folder, a home): the measuring machine's, not the reader's.
_OUTSIDE = re.compile(r"(?<![\w.~$-])/(?:tmp|var|home|root|work|Users|private|mnt|scratch)(?:/[^\s\\\"'`,;:)]*)?")


def portable(text: str) -> str:
    """``text`` without the measuring machine's own paths, for a record: a path in the repository becomes relative
    to it, and any other absolute path under a temporary or home folder becomes ``$SCRATCH/`` plus what follows its
    first two components (``/tmp/tmp.X1b/floor.xml`` -> ``$SCRATCH/floor.xml``, ``/tmp/work`` -> ``$SCRATCH``)."""
    text = text.replace(str(ROOT) + "/", "")
    text = re.sub(re.escape(str(ROOT)) + r"(?![\w.-])", ".", text)  # ROOT itself, not a sibling like ROOT-old

    def label(match: re.Match) -> str:
        rest = Path(match.group(0)).parts[3:]
        return "/".join(("$SCRATCH", *rest))

    return _OUTSIDE.sub(label, text)


def command_line() -> str:
    """The command that ran this script, as typed from the repository root, without the machine's own paths."""
    script = Path(sys.argv[0]).resolve()
    try:
        script = script.relative_to(ROOT)
    except ValueError:
        pass
    return portable(shlex.join(["python", str(script), *sys.argv[1:]]))


def describe(report: dict) -> str:
    """One markdown paragraph: the command, the machine and the versions a report was measured with."""
    m, v = report["machine"], report["versions"]
    load = m.get("load_average")
    return (
        f"Measured with `{report['command']}` on {m['cpu']} ({m['cores']} cores, {m['memory_gb']} GB"
        + (f", load average {load[0]:.1f} at the start" if load else "")
        + f"), {m['os']}; Python {m['python']}, "
        + ", ".join(f"{name} {version}" for name, version in v.items() if version)
        + f"; {m['utc']}."
    )


def _write_atomically(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(
        "w", encoding="utf-8", dir=path.parent, prefix=f".{path.name}.", delete=False
    ) as f:
        f.write(text)
    os.replace(f.name, path)


def write_results(folder: str | os.PathLike, report: dict, markdown: str, name: str = "results") -> Path:
    """Write ``<name>.json`` and ``<name>.md`` into ``folder``; each file is whole, old or new."""
    import json

    folder = Path(folder)
    _write_atomically(folder / f"{name}.json", json.dumps(report, indent=2) + "\n")
    _write_atomically(folder / f"{name}.md", markdown)
    return folder


def new_report(topic: str, **fields) -> dict:
    """The common head of every report: topic, command, machine, versions, git commit; then ``fields``."""
    return {
        "topic": topic,
        "command": command_line(),
        "machine": machine(),
        "versions": package_versions(),
        "git_commit": git_commit(),
        **fields,
    }


# Runs the command it is given and reports on it, from a process that has not imported torch: a child's ru_maxrss
# counts the memory it was forked with, which is then this small wrapper's, not the measuring script's. A memory
# cgroup named by MEASURE_CGROUP is joined first, so that the command is born in it.
_PEAK_MEMORY_WRAPPER = """
import json, os, resource, subprocess, sys, tempfile, time
start = time.perf_counter()
if os.environ.get("MEASURE_CGROUP"):
    open(os.path.join(os.environ["MEASURE_CGROUP"], "cgroup.procs"), "w").write(str(os.getpid()))
out, err = tempfile.TemporaryFile(), tempfile.TemporaryFile()
child = subprocess.Popen(sys.argv[1:], stdout=out, stderr=err)
anon = 0
while child.poll() is None:
    try:
        status = open(f"/proc/{child.pid}/status").read()
        anon = max(anon, int(status.split("RssAnon:")[1].split()[0]))
    except (OSError, IndexError, ValueError):
        pass
    time.sleep(0.02)
usage = resource.getrusage(resource.RUSAGE_CHILDREN)  # poll() reaped the child: the largest child's peak
out.seek(0); err.seek(0)
print(json.dumps({"status": child.returncode, "peak_mib": usage.ru_maxrss / 1024, "anon_mib": anon / 1024,
                  "seconds": time.perf_counter() - start, "out": out.read().decode()[-400:],
                  "err": err.read().decode()[-2000:]}))
"""


def run_measuring_memory(command: list[str], env: dict, cgroup: str | os.PathLike | None = None) -> dict:
    """Run ``command`` in a fresh process and return its exit ``status``, wall ``seconds``, peak resident set
    (``peak_mib``: ru_maxrss, the file pages it touched included) and the peak of its anonymous part (``anon_mib``:
    ``RssAnon`` of /proc/PID/status, read every 20 ms, the memory it holds itself), with the tails of its ``out``
    and ``err``; inside the memory cgroup folder ``cgroup`` if given. Unrounded; the caller decides on failure.

    >>> run_measuring_memory([sys.executable, "-c", "print('hi')"], dict(os.environ))["out"]
    'hi\\n'
    """
    import json

    env = {**env, "MEASURE_CGROUP": str(cgroup or "")}
    done = subprocess.run(
        [sys.executable, "-c", _PEAK_MEMORY_WRAPPER, *command], env=env, capture_output=True, text=True, check=True
    )
    return json.loads(done.stdout)
