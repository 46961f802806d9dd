"""The tables scripts/bench.py prints: one benchmark's results, or an A/B comparison."""

from __future__ import annotations

from typing import Callable, Optional

from ropelab.model.encodings import DEFAULT_KIND


def fmt(value: Optional[float], spec: str = ",.0f") -> str:
    return "—" if value is None else format(value, spec)


def name_width(kinds: list[str]) -> int:
    return max(11, *(len(k) for k in kinds))


def per_kind(title: str, section: Optional[dict], kinds: list[str], line: Callable[[dict], str]) -> None:
    """A titled block with one line per row (or its error)."""
    if not section:
        return
    print(title)
    for kind in kinds:
        r = section.get(kind, {})
        busy = "  (measured while busy)" if r.get("busy") else ""
        print(f"{kind:<{name_width(kinds)}} " + (f"error: {r['error']}" if "error" in r else line(r)) + busy)


def peak_text(peak: Optional[dict]) -> str:
    """The matmul peak MFU is against, named: its rate, dtype, size and when it was measured."""
    if not peak:
        return "MFU against a matmul peak measured beside each row"
    busy = f", while other work shared the CPUs ({peak['busy']})" if peak.get("busy") else ""
    return (f"MFU against the matmul peak of {peak['flops'] / 1e9:,.0f} GFLOP/s ({peak['dtype']}, best of 10 at "
            f"{peak['size']}², measured {peak.get('when', 'at the start of this run')}{busy})")


def _training(train: dict, comp: dict, kinds: list[str], peak: Optional[dict] = None) -> None:
    any_ok = next((r for r in [*train.values(), *comp.values()] if "error" not in r), None)
    if any_ok:
        print(f"\ntraining, {any_ok['tokens_per_step']} tokens/step, {any_ok['dtype']}, "
              f"{any_ok['params'] / 1e6:.2f}M params; {peak_text(peak)}"
              + ("; the speed-up compares eager and compiled steps taken in turn in one process"
                 if any(c.get("paired") for c in comp.values()) else ""))
    width = name_width(kinds)
    print(f"{'encoding':<{width}} {'tok/s':>8} {'MFU':>6} {'vs ' + DEFAULT_KIND:>7} {'RSS MB':>7} │ "
          f"{'compiled':>8} {'MFU':>6} {'speed-up':>8} {'RSS MB':>7}")
    base = train.get(DEFAULT_KIND, {}).get("tok_s")
    for kind in kinds:
        r, c = train.get(kind, {}), comp.get(kind, {})
        if "error" in r:
            print(f"{kind:<{width}} error: {r['error']}")
            continue
        rel = r.get("tok_s") / base if base and r.get("tok_s") else None
        speed = c.get("tok_s") / r["tok_s"] if c.get("tok_s") and r.get("tok_s") else None
        if c.get("paired"):  # eager and compiled steps alternating in one process: the fair ratio
            speed = c["paired"]["speedup"]
        c_err = f"  compile error: {c['error']}" if "error" in c else ""
        busy = "  (measured while busy)" if r.get("busy") or c.get("busy") else ""
        print(f"{kind:<{width}} {fmt(r.get('tok_s')):>8} "
              f"{fmt(r.get('mfu') and 100 * r['mfu'], '.1f'):>5}% {fmt(rel, '.2f'):>7} "
              f"{fmt(r.get('peak_rss_mb')):>7} │ {fmt(c.get('tok_s')):>8} "
              f"{fmt(c.get('mfu') and 100 * c['mfu'], '.1f'):>5}% {fmt(speed, '.2f'):>7}× "
              f"{fmt(c.get('peak_rss_mb')):>7}{c_err}{busy}")


def print_profile(ops: list[dict], title: str) -> None:
    print(f"\n{title} (self CPU, torch.profiler):")
    for op in ops:
        print(f"  {op['share']:6.1%} {op['self_cpu_ms_per_step']:8.1f} ms {op['calls_per_step']:6.0f}×  {op['op'][:70]}")


def _decode_line(d: dict) -> str:
    cells = "  ".join(f"{r['new_tokens']:>5}: {r['cached_tok_s']:6.0f} vs {r['uncached_tok_s']:6.1f} "
                      f"({r['speedup']:5.1f}×)" for r in d["rows"])
    lat = d["latency"]
    return f"{cells}   latency {lat['start_ms']:.2f} → {lat['end_ms']:.2f} ms ({lat['end_over_start']:.2f}×)"


def print_shape(name: str, shape: dict) -> None:
    """One shape's sections, one line per row."""
    kinds = shape["kinds"]
    print(f"\n=== shape {name}: {shape['config']} {' '.join(shape['overrides'])}")
    train, comp = shape.get("train", {}), shape.get("compile", {})
    if train or comp:
        _training(train, comp, kinds, shape.get("peak"))
    for kind in kinds:
        for label, section in (("eager", train), ("compiled", comp)):
            if section.get(kind, {}).get("profile"):
                print_profile(section[kind]["profile"], f"where one {label} {kind} training step spends its time")
    per_kind("\ndecoding, greedy, batch 1, prompt 16 (tokens/s; cached vs a full forward per token)",
             shape.get("decode"), kinds, _decode_line)
    per_kind("\nevaluation (perplexity, non-overlapping windows): tokens/s, FLOP/s as a ratio of the bare "
             "forward's at that length (× fwd), and peak RSS", shape.get("eval"), kinds,
             lambda e: "  ".join(f"{r['multiplier']:>2}× L={r['length']:<5} {r['tok_s']:7.0f} tok/s "
                                 + (f"{r['flops_ratio']:4.2f}× fwd " if "flops_ratio" in r else "")
                                 + f"{r['peak_rss_mb']:6.0f} MB" for r in e["rows"]))
    for kind, reason in shape.get("skipped", {}).items():
        print(f"\nskipped {kind}: {reason}")


def headline(result: dict, section: str) -> Optional[float]:
    """The number an A/B compares: tokens/s of a step, or of the longest decode/eval row."""
    if "error" in result:
        return None
    if section in ("train", "compile"):
        return result["tok_s"]
    row = result["rows"][-1]
    return row["cached_tok_s"] if section == "decode" else row["tok_s"]


def print_comparison(results: dict) -> None:
    base, this = results["compare"]["base"], results["compare"]["this"]
    print(f"\nA/B in one run: base {base[:12]} vs this {this[:12]} (tokens/s; ratio = this / base; with "
          "--rounds: medians, and the median paired ratio with its 95% interval)")
    for name, shape in results["shapes"].items():
        print(f"\n=== shape {name}: {shape['config']} {' '.join(shape['overrides'])}")
        width = name_width(shape["kinds"])
        for section in (s for s in ("train", "compile", "decode", "eval") if s in shape):
            print(f"{section:<8} {'':<{width - 8}} {'base':>9} {'this':>9} {'ratio':>7}  95% interval")
            for kind in shape["kinds"]:
                pair = shape[section][kind]
                a, b = headline(pair["base"], section), headline(pair["this"], section)
                ratio, interval = b / a if a and b else None, ""
                if "ratio" in pair:  # --rounds
                    r = pair["ratio"]
                    ratio = r["median"]
                    interval = (f"[{r['low']:.3f}, {r['high']:.3f}]" if r["low"] is not None
                                else "— (6 rounds or more)") + f" over {r['pairs']} pair{'s' if r['pairs'] != 1 else ''}"
                print(f"  {kind:<{width}} {fmt(a):>9} {fmt(b):>9} {fmt(ratio, '.3f'):>7}  {interval}")
                for side in ("base", "this"):
                    if pair[side].get("profile"):
                        print_profile(pair[side]["profile"], f"{side}: one {kind} training step")
