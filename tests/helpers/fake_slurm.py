"""Stand-ins for Slurm's commands, so the launcher's tests need no cluster.

``FakeSlurm(tmp, monkeypatch)`` puts ``sbatch``, ``srun``, ``squeue``, ``sacct`` and
``scancel`` first on PATH. sbatch keeps each job script it is given and answers with the
next job id (or refuses with ``refuse(text)``'s stderr, as a cluster would); squeue and
sacct answer from the states the test sets (``set_states``), squeue erring on one unknown
id like the real one; scancel records its arguments.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

SBATCH = """
import sys
from pathlib import Path
d = Path(__file__).parent
if (d / "refuse").exists():
    sys.stderr.write((d / "refuse").read_text())
    sys.exit(1)
n = len(list(d.glob("sbatch-*.sh"))) + 1
(d / f"sbatch-{n}.sh").write_text(Path(sys.argv[-1]).read_text())
print(f"Submitted batch job {n}")
"""

QUERY = """
import json, sys
from pathlib import Path
d = Path(__file__).parent
ids = next(a for a in sys.argv if a.startswith("--jobs=")).split("=", 1)[1].split(",")
table = json.loads((d / "{table}.json").read_text()) if (d / "{table}.json").exists() else None
if table is None and "{table}" == "squeue":  # an empty queue
    table = {}
if table is None:
    sys.stderr.write("Slurm accounting storage is disabled\\n")
    sys.exit(1)
known = [i for i in ids if i in table]
if len(ids) == 1 and not known and "{table}" == "squeue":
    sys.stderr.write("slurm_load_jobs error: Invalid job id specified\\n")
    sys.exit(1)
for i in known:
    state, _, reason = table[i].partition(" ")
    print(f"{i}|{state}|{reason or 'None'}" if "{table}" == "squeue" else f"{i}|{state}")
"""

SCANCEL = """
import sys
from pathlib import Path
with open(Path(__file__).parent / "scancel.log", "a") as f:
    f.write(" ".join(sys.argv[1:]) + "\\n")
"""


class FakeSlurm:
    def __init__(self, tmp: Path, monkeypatch, commands=("sbatch", "srun", "squeue", "sacct", "scancel")):
        self.dir = tmp / "fake-slurm"
        self.dir.mkdir(exist_ok=True)
        programs = {"sbatch": SBATCH, "srun": "", "squeue": QUERY.replace("{table}", "squeue"),
                    "sacct": QUERY.replace("{table}", "sacct"), "scancel": SCANCEL}
        for name in commands:
            path = self.dir / name
            path.write_text(f"#!{sys.executable}\n{programs[name]}")
            path.chmod(0o755)
        monkeypatch.setenv("PATH", f"{self.dir}:/usr/bin:/bin")

    def set_states(self, squeue: dict[str, str], sacct: dict[str, str] | None = None) -> None:
        """{job id: "STATE" or "STATE Reason"}; sacct None: accounting is off."""
        (self.dir / "squeue.json").write_text(json.dumps(squeue))
        if sacct is not None:
            (self.dir / "sacct.json").write_text(json.dumps(sacct))

    def refuse(self, stderr: str) -> None:
        (self.dir / "refuse").write_text(stderr)

    def scripts(self) -> list[str]:
        """The job scripts sbatch was given, in order."""
        return [(self.dir / f"sbatch-{n}.sh").read_text() for n in range(1, len(list(self.dir.glob("sbatch-*.sh"))) + 1)]

    def cancelled(self) -> list[str]:
        log = self.dir / "scancel.log"
        return log.read_text().split() if log.exists() else []
