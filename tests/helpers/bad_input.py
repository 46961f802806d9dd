"""What the bad-input suite (tests/integration/test_bad_input*.py) shares: running a command line in a
subprocess or its ``main`` in-process, the checks that it was refused cleanly, a snapshot
of a directory to show nothing saved was touched, and following the advice of a message.

Each ``test_bad_input*.py`` file holds cases of one area; ``python -m pytest --collect-only
-q tests/integration/test_bad_input*.py`` counts them (a parametrized case counts once per parameter).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Callable

from safetensors.torch import load_file, save_file

from ropelab import train
from ropelab.training import memory
from ropelab.training.checkpoint import WEIGHTS_KEY, file_sha256

from helpers import ROOT


def cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=ROOT, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", **(env or {})})


def refused(res: subprocess.CompletedProcess, *fragments: str) -> None:
    assert res.returncode == 2, (res.returncode, res.stderr)
    assert "Traceback" not in res.stderr, res.stderr
    for fragment in fragments:
        assert fragment in res.stderr, (fragment, res.stderr)


def refused_in_process(main: Callable, argv: list[str], capsys, *fragments: str) -> str:
    """Run ``main(argv)``, check exit code 2 and the fragments; the error output."""
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2, err
    for fragment in fragments:
        assert fragment in err, (fragment, err)
    return err


def snapshot(path: Path) -> dict[str, str]:
    """Every file under ``path`` (or ``path`` itself) -> the sha256 of its bytes."""
    path = Path(path)
    if path.is_file():
        return {path.name: hashlib.sha256(path.read_bytes()).hexdigest()}
    return {str(p.relative_to(path)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(path.rglob("*")) if p.is_file()}


def advised_command(message: str) -> str:
    """The command a message ends with: ``[mv A B && ]python train.py ARGS``."""
    match = re.search(r"(mv \S+ \S+ && )?python train\.py .*$", message.strip())
    assert match is not None, message
    return match.group(0)


def follow(message: str, capsys=None) -> int:
    """Do what a message advises (``[mv A B && ]python train.py ARGS``) and return the exit
    code of train.py (run in-process, as the command line would)."""
    command = advised_command(message)
    for part in command.split(" && "):
        words = shlex.split(part)
        if words[0] == "mv":
            shutil.move(words[1], words[2])
        else:
            assert words[:2] == ["python", "train.py"], command
            code = train.main(words[2:])
            if capsys is not None:
                capsys.readouterr()
            return code
    raise AssertionError(f"no train.py command in: {command}")


def limit_memory(monkeypatch, tmp_path: Path, available: float) -> None:
    """training/memory.py reads ``available`` bytes from a /proc/meminfo of the test's own, and
    no cgroup limit: the limit every memory check meets, whatever the machine."""
    meminfo = tmp_path / "meminfo"
    meminfo.write_text(f"MemTotal: {2 * int(available) // 1024} kB\nMemAvailable: {int(available) // 1024} kB\n")
    monkeypatch.setattr(memory, "MEMINFO", meminfo)
    monkeypatch.setattr(memory, "CGROUP_V2", tmp_path / "no-cgroup")
    monkeypatch.setattr(memory, "CGROUP_V1", tmp_path / "no-cgroup")


def rewrite_latest_weights(run: Path, edit: Callable[[dict], None]) -> None:
    """Change the newest checkpoint's weights with ``edit`` (in place, on the tensors by name)
    and record the file's digest, as a checkpoint saved with those weights would."""
    ckpt = max((run / "checkpoints").glob("step_*"))
    path = ckpt / "model.safetensors"
    tensors = {k: v.clone() for k, v in load_file(str(path)).items()}
    edit(tensors)
    save_file(tensors, str(path))
    meta = json.loads((ckpt / "meta.json").read_text())
    (ckpt / "meta.json").write_text(json.dumps({**meta, WEIGHTS_KEY: file_sha256(path)}))


def overflow_weights(run: Path) -> None:
    """Finite weights whose forward overflows: the final norm's gain at float32's largest
    values turns every logit into inf - inf."""
    rewrite_latest_weights(run, lambda tensors: tensors["norm.weight"].fill_(3e38))
