"""Run every command the README shows, in its order, as a newcomer would type them.

    python .ci/readme_commands.py           # shortened (CI): trainings of 20 steps, quick benches
    python .ci/readme_commands.py --full    # verbatim, timing each (to state the README's times)

Run from the repository root of a clone with the project installed; runs and reports go to
runs/ and reports/ there, as the README's commands put them (a grid's --report rewrites its
report in the clone's docs/results/). Skipped: the setup and test commands (CI runs those
itself) and commands with a placeholder (PATH); a command that trains a whole grid runs as
--dry-run when shortened and is skipped with --full. Exits 1 at the first command that
fails, naming it.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SHORT_TRAINING = ["train.max_steps=20", "train.eval_interval=10", "log.progress=false"]
SHORT_BENCH = ["--repeats", "2", "--warmup", "0", "--decode-repeats", "1", "--decode-lengths", "16"]


def readme_commands(text: str) -> list[str]:
    """The README's commands in order: inline `ropelab …` / `python train.py …` spans and the
    lines of its bash blocks, without setup, tests and placeholders."""
    found = []
    for match in re.finditer(r"```bash\n(.*?)```|`((?:ropelab|python train\.py) [^`]+)`", text, re.S):
        lines = match.group(1).splitlines() if match.group(1) is not None else [match.group(2)]
        found += [line.split("  #")[0].strip() for line in lines]
    keep = []
    for command in found:
        if not command or command.startswith(("python3 -m venv", "pip ", "python -m pytest")) or "PATH" in command:
            continue
        if command.endswith("--help") or command not in keep:
            keep.append(command)
    return keep


def trains_a_grid(args: list[str]) -> bool:
    """``ropelab ablate GRID`` that would train the grid (hours), not a dry run or a report."""
    return args[:2] == ["ropelab", "ablate"] and not {"--dry-run", "--report", "--status"} & set(args)


def shortened(command: str) -> list[str]:
    args = shlex.split(command)
    if args[:2] == ["python", "train.py"]:
        return [sys.executable, "train.py", *args[2:], *SHORT_TRAINING]
    if args[:2] == ["ropelab", "bench"]:
        return [*args, *SHORT_BENCH]
    if trains_a_grid(args):  # the study itself: what it would train, not the training
        return [*args, "--dry-run", "--no-estimate"]
    return args


def main(argv: list[str]) -> int:
    full = "--full" in argv
    commands = readme_commands((ROOT / "README.md").read_text(encoding="utf-8"))
    for command in commands:
        args = shlex.split(command) if full else shortened(command)
        if full and trains_a_grid(args):
            print(f"$ {command}\n  skipped: trains a whole study (the README states its time)", flush=True)
            continue
        if args[:2] == ["python", "train.py"]:
            args[0] = sys.executable
        print(f"$ {shlex.join(args)}", flush=True)
        started = time.perf_counter()
        done = subprocess.run(args, cwd=ROOT, stdout=subprocess.DEVNULL if not full else None)
        seconds = time.perf_counter() - started
        print(f"  exit {done.returncode} in {seconds:.1f} s", flush=True)
        if done.returncode != 0:
            print(f"error: the README's command failed (exit {done.returncode}): {command}", file=sys.stderr)
            return 1
    print(f"{len(commands)} README commands ran")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
