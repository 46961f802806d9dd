"""Config section for the attention diagnostics: ``eval.diagnostics`` (nested in the one EvalConfig).

What ``ropelab diagnose`` measures and on how much data, and whether a grid
(ropelab ablate) writes the diagnostics into its report. The measures themselves live
in eval/diagnostics/measure.py; docs/diagnostics.md explains each one.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ropelab.common.errors import ConfigError


@dataclass
class DiagnosticsConfig:
    """Attention diagnostics: entropy, attended distance, sinks, q·k norm per RoPE frequency,
    attention on a passkey's needle.

    ``enabled`` has a grid write them into its report's ``diagnostics/``; the command line
    computes them whatever it says. ``windows``: evaluation windows per length, spread
    evenly over the run's ``eval.split`` (task instances for a synthetic run). ``lengths``:
    the diagnosed lengths; where empty, ``length_multipliers`` × train.seq_len (rounded), so
    one setting serves the runs of a grid trained at different lengths. The training length
    is always one of them. A head is a sink head when its mean attention on the first
    ``sink_tokens`` tokens exceeds ``epsilon`` (Gu et al. 2025: ε = 0.3, the first token).
    """

    enabled: bool = False
    windows: int = 8
    lengths: list[int] = field(default_factory=list)
    length_multipliers: list[float] = field(default_factory=lambda: [1.0, 2.0, 4.0, 8.0, 16.0])
    epsilon: float = 0.3
    sink_tokens: int = 1

    def __post_init__(self) -> None:
        for key in ("windows", "sink_tokens"):
            if getattr(self, key) < 1:
                raise ConfigError(f"eval.diagnostics.{key} must be a positive integer (got {getattr(self, key)})")
        if any(n < 1 for n in self.lengths):
            raise ConfigError(f"eval.diagnostics.lengths must be positive integers (got {self.lengths})")
        if any(not m > 0 for m in self.length_multipliers):
            raise ConfigError(f"eval.diagnostics.length_multipliers must be positive (got {self.length_multipliers})")
        if not self.lengths and not self.length_multipliers:
            raise ConfigError("set eval.diagnostics.lengths or eval.diagnostics.length_multipliers (both are empty)")
        if not 0.0 < self.epsilon < 1.0:
            raise ConfigError(f"eval.diagnostics.epsilon must be in (0, 1) (got {self.epsilon}): a head is a sink "
                              "head when its mean attention on the first token exceeds it (0.3 in Gu et al. 2025)")

    def resolved_lengths(self, train_len: int) -> list[int]:
        """The diagnosed lengths, ascending and distinct, the training length among them."""
        chosen = self.lengths or [max(1, round(m * train_len)) for m in self.length_multipliers]
        return sorted({train_len, *chosen})
