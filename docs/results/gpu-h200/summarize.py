"""Summarize the training logs of the one-H200 attempt at the GPU core grid (README.md here).

    python docs/results/gpu-h200/summarize.py   # writes docs/results/gpu-h200/summary.md

Reads core-gpu-local/<run>.metrics.jsonl, the runs' own metrics.jsonl as training wrote
them. The runs shared one GPU, so a run's tokens/s and MFU are its share of the GPU; the
aggregate line divides every run's tokens by the wall time from the first logged step to
the last.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> None:
    lines = ["| run | steps | tokens/s (median) | MFU (median) | peak memory | final val loss |",
             "|---|---:|---:|---:|---:|---:|"]
    steps_all, tokens = [], 0
    for path in sorted((HERE / "core-gpu-local").glob("*.metrics.jsonl")):
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        steps = [r for r in rows if "tokens_per_sec" in r]
        val = [r["val_loss"] for r in rows if "val_loss" in r]
        timed = steps[1:]  # the first logged interval holds start-up and compilation
        lines.append(f"| {path.name.removesuffix('.metrics.jsonl')} | {steps[-1]['step']} | "
                     f"{statistics.median(r['tokens_per_sec'] for r in timed):,.0f} | "
                     f"{100 * statistics.median(r['mfu'] for r in timed):.1f}% | "
                     f"{max(r['peak_mem_gib'] for r in steps):.1f} GiB | {val[-1]:.4f} |")
        steps_all += steps
        tokens += steps[-1]["tokens"]
    span = max(r["time"] for r in steps_all) - min(r["time"] for r in steps_all)
    lines += ["", f"Aggregate: {tokens:,} tokens in {span:.0f} s from the first logged step of any run "
              f"to the last, {tokens / span:,.0f} tokens/s on the one GPU."]
    (HERE / "summary.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
