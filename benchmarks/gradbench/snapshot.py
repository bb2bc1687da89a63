"""The GradBench checkout the runner drives: where it is, what it lacks, and
how to lay one out from a snapshot.

GradBench is never copied into this repository. The runner reads a
checkout from ``--gradbench`` (default ``$TE_GRADBENCH_DIR`` or
``~/.cache/te-gradbench/gradbench``): a ``git clone`` of
github.com/gradbench/gradbench, or the tree of a snapshot's commit laid
out by ``python -m benchmarks.gradbench --setup GIT_DIR`` (``setup``
below; a bare repository such as a mirror, whose blobs may be incomplete).
From it the runner uses the Python package ``python/gradbench`` (the evals,
their input generators and validators, the JAX and PyTorch tools), the
data under ``evals/``, and, if present, the ``manual`` tool's executables
under ``tools/manual/bin`` (built beforehand, see README.md; its OpenMP
build under ``tools/manual/bin-mt``). The eval validators themselves call
``tools/manual/bin``: without it GradBench cannot validate.
"""
from __future__ import annotations

import importlib.util
import os
import random
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

DEFAULT_DIR = Path(os.environ.get("TE_GRADBENCH_DIR", Path.home() / ".cache" / "te-gradbench" / "gradbench"))
COMMIT_FILE = ".gradbench-commit"
MISSING_FILE = ".gradbench-missing"

#: Python packages GradBench's evals and tools import, with the pip name
PYTHON_DEPS = {"pydantic": "pydantic", "dataclasses_json": "dataclasses-json", "scipy": "scipy"}
PEER_DEPS = {"jax": "jax", "pytorch": "torch"}

LSTM_TEXT = Path("evals/lstm/data/lstm_full.txt")


class SetupError(RuntimeError):
    """The GradBench checkout is missing or unusable; the message says what to do."""


@dataclass
class Checkout:
    root: Path
    commit: str
    notes: list[str] = field(default_factory=list)

    @property
    def python_dir(self) -> Path:
        return self.root / "python" / "gradbench"

    def manual_bin(self, multithreaded: bool) -> Path:
        return self.root / "tools" / "manual" / ("bin-mt" if multithreaded else "bin")

    def has_manual(self, multithreaded: bool = False) -> bool:
        d = self.manual_bin(multithreaded)
        return d.is_dir() and any(d.iterdir())


def locate(root: Path | str | None = None) -> Checkout:
    """The checkout at ``root``, checked; raises SetupError saying how to get one."""
    root = Path(root) if root else DEFAULT_DIR
    if not (root / "python" / "gradbench" / "gradbench" / "eval.py").is_file() or not (root / "evals").is_dir():
        raise SetupError(
            f"no GradBench checkout at {root}: clone github.com/gradbench/gradbench there, or lay out a "
            f"snapshot with `python -m benchmarks.gradbench --setup GIT_DIR` (see benchmarks/gradbench/README.md)")
    missing = [pip for module, pip in PYTHON_DEPS.items() if importlib.util.find_spec(module) is None]
    if missing:
        raise SetupError(f"GradBench's evals need {', '.join(missing)}: pip install -e '.[gradbench]'")
    checkout = Checkout(root=root, commit=_commit(root))
    missing_list = root / MISSING_FILE
    if missing_list.is_file():
        checkout.notes += [f"not in the snapshot: {p}" for p in missing_list.read_text().split()]
    return checkout


def _commit(root: Path) -> str:
    recorded = root / COMMIT_FILE
    if recorded.is_file():
        return recorded.read_text().strip()
    try:
        return subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def peers_installed() -> dict[str, bool]:
    return {tool: importlib.util.find_spec(module) is not None for tool, module in PEER_DEPS.items()}


def setup(git_dir: Path | str, root: Path | str | None = None, commit: str = "HEAD") -> Checkout:
    """Lay out ``commit`` of the repository ``git_dir`` (bare or not) at
    ``root``, skipping files whose blobs the snapshot lacks (a mirror may omit
    large data files); records the commit. Replaces an earlier layout's
    files, keeps anything else there (a built ``tools/manual/bin``)."""
    root = Path(root) if root else DEFAULT_DIR
    git = ["git", "--git-dir", str(git_dir)]
    sha = subprocess.run(git + ["rev-parse", commit], capture_output=True, text=True, check=True).stdout.strip()
    listing = subprocess.run(git + ["ls-tree", "-r", "-z", sha], capture_output=True, check=True).stdout
    entries = [e.decode().split("\t", 1) for e in listing.split(b"\0") if e]
    present = subprocess.run(git + ["cat-file", "--batch-check"], input="\n".join(m.split()[2] for m, _ in entries),
                             capture_output=True, text=True).stdout.splitlines()
    skipped = []
    root.mkdir(parents=True, exist_ok=True)
    for (meta, path), check in zip(entries, present):
        mode, kind, blob = meta.split()
        if kind != "blob" or mode == "120000":
            continue
        if check.endswith("missing"):
            skipped.append(path)
            continue
        target = root / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(subprocess.run(git + ["cat-file", "blob", blob], capture_output=True, check=True).stdout)
        if mode == "100755":
            target.chmod(0o755)
    (root / COMMIT_FILE).write_text(sha + "\n")
    (root / MISSING_FILE).write_text("".join(p + "\n" for p in skipped))
    return locate(root)


def ensure_lstm_text(checkout: Checkout) -> None:
    """GradBench's lstm eval reads the first characters of ``lstm_full.txt``
    (ADBench's text, over 4 MiB, which a snapshot may lack). Without it, write
    a stand-in of the same character width: the eval's inputs then have the
    real shapes (14 bits a character) and different values, which changes no
    timing (the LSTM has no data-dependent control flow); noted in the report."""
    path = checkout.root / LSTM_TEXT
    marker = path.with_suffix(".standin")
    if path.is_file() and not marker.exists():
        return
    if not path.is_file():
        rng = random.Random(31337)
        letters = "abcdefghijklmnopqrstuvwxyz     ,.\n"
        text = "\u2019" + "".join(rng.choice(letters) for _ in range(16383))   # U+2019 needs 14 bits, as ADBench's
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf8")
        marker.write_text("written by benchmarks.gradbench.snapshot.ensure_lstm_text\n")
    checkout.notes.append(f"{LSTM_TEXT} is a stand-in (the snapshot lacks ADBench's text): same shapes "
                          "(14-bit characters), other values")
