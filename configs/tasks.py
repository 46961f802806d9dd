"""Config sections for synthetic tasks: what a synthetic run trains on, and how tasks are scored.

``data.synthetic`` (SyntheticConfig) picks the tasks a ``data.source: synthetic`` run trains
on and their parameters; ``eval.tasks`` (TaskEvalConfig, nested in the one EvalConfig)
says which tasks ``ropelab tasks`` scores, on how many instances, at which passkey
depths, and what counts as retrieval succeeding for k_max. The generators themselves
live in ``data/tasks/``; ``TASK_NAMES`` is the one list of them (tests/integration/test_tasks.py
keeps the registry's keys equal to it).
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from typing import Literal, Optional, Union

from ropelab.common.errors import ConfigError

TaskName = Literal["passkey", "copy", "recall", "addition", "multikey", "multivalue", "vartrack"]
TASK_NAMES: tuple[str, ...] = typing.get_args(TaskName)
# Retrieval in filler text (RULER's families, Hsieh et al. 2024, §3): written in plain words and
# digits, so a text run's own tokenizer can write them too (data.mix).
RETRIEVAL_TASKS: tuple[str, ...] = ("passkey", "multikey", "multivalue", "vartrack")


def check_counts(section: str, values: dict) -> None:
    """The range of each count in ``values`` (data.synthetic keys; None: not given) that holds
    whatever the other keys are; ConfigError naming ``section``.KEY for the first out of range."""
    ranges = {"key_digits": (1, 18, ""), "pairs": (1, 26, ": keys are the letters a-z"), "distractors": (0, None, ""),
              "needles": (1, None, ""), "values": (1, None, ""), "chains": (1, None, ""), "hops": (1, None, ""),
              "name_letters": (1, 8, "")}
    for key, (low, high, why) in ranges.items():
        value = values.get(key)
        if value is None or (value >= low and (high is None or value <= high)):
            continue
        if high is not None:
            raise ConfigError(f"{section}.{key} must be in [{low}, {high}]{why} (got {value})")
        raise ConfigError(f"{section}.{key} must be {'a positive integer' if low == 1 else '0 or more'} (got {value})")


@dataclass
class SyntheticConfig:
    """Tasks made on the fly (data/tasks/): instances are drawn, never stored or downloaded.

    Each training instance comes from one of ``tasks``, drawn uniformly (one task: a
    single-task run; several: one model learns them all), with a length drawn uniformly
    between that task's shortest instance and ``train.seq_len``; it is padded to
    ``train.seq_len`` and only its answer tokens count in the loss.
    """

    tasks: list[TaskName] = field(default_factory=lambda: ["passkey"])
    key_digits: int = 5  # passkey: digits of the key (Chen et al. 2023 use 5 random digits)
    pairs: int = 8  # recall: key-value pairs stated before the queries (at most 26 keys)
    queries: Optional[int] = None  # recall: keys queried per instance (None: every pair once)
    # addition: each sum digit right after its operand digits, or the whole sum after both
    # operands (see data/tasks/addition.py)
    addition_layout: Literal["aligned", "sequential"] = "aligned"
    # passkey: numbers of key_digits digits strewn in the filler, none equal to the key, so
    # copying "the digits" is not enough: the model must find the ones after "key: "
    distractors: int = 0
    needles: int = 4  # multikey: name-value needles, one of them queried (RULER's NIAH multi-key)
    # multikey, vartrack: needles (chains) asked per instance, one question after another (1: RULER's
    # NIAH multi-key and variable tracking; more: its multi-query, every asked value scored), which
    # gives training more answers per instance; all: every needle (chain) of the instance; mixed:
    # a uniformly drawn 1 to all of them in each instance, so that training also sees the
    # one-question layout (needles up to the end of the filler at L) that eval.tasks.asked: 1 scores
    asked: Union[int, Literal["all", "mixed"]] = 1
    values: int = 4  # multivalue: values stated for one name, all asked (RULER's NIAH multi-value)
    chains: int = 2  # vartrack: assignment chains, one of them queried (RULER's variable tracking)
    hops: int = 2  # vartrack: assignments after each chain's value (hops to resolve)
    name_letters: int = 2  # multikey, multivalue, vartrack: letters of a name or variable
    # multikey, multivalue, vartrack: "name: value", "y = x" (true) or "name:value", "y=x"
    # (false: the name right before the ":" its answer follows; data/tasks/haystack.py);
    # passkey: "key: K" or "key:K" (data/tasks/passkey.py)
    spaced: bool = True
    # vartrack: what the asked variable's answer is: its chain's value ("ba: 83194", RULER's one
    # value) or the chain itself back to the value ("ba: ib = 83194"), each name then its
    # value a lookup of its own, as RULER's answer lists the chain's names (data/tasks/vartrack.py)
    vartrack_answer: Literal["value", "chain"] = "value"
    # vartrack: how the question names the asked variable: "ba: " (colon) or in the assignments'
    # own form, "ba = " (equals), which makes its first lookup the one multikey's is (the name
    # right before the mark the answer follows; data/tasks/vartrack.py)
    vartrack_question: Literal["colon", "equals"] = "colon"

    def __post_init__(self) -> None:
        if not self.tasks or len(set(self.tasks)) != len(self.tasks):
            raise ConfigError(f"data.synthetic.tasks must name one or more distinct tasks of "
                              f"{', '.join(TASK_NAMES)} (got {self.tasks})")
        check_counts("data.synthetic", dataclasses.asdict(self))
        if self.queries is not None and not 1 <= self.queries <= self.pairs:
            raise ConfigError(f"data.synthetic.queries must be in [1, pairs={self.pairs}]: each query "
                              f"asks for a distinct stated key (got {self.queries})")
        if self.asked not in ("all", "mixed"):
            for task, most in (("multikey", self.needles), ("vartrack", self.chains)):
                if task in self.tasks and not 1 <= self.asked <= most:
                    raise ConfigError(f"data.synthetic.asked must be in [1, {'needles' if task == 'multikey' else 'chains'}"
                                      f"={most}] for {task}: each question asks for a distinct one (got {self.asked}); "
                                      "all asks every one, mixed 1 to all of them")
            if self.asked < 1:
                raise ConfigError(f"data.synthetic.asked must be a positive integer, all or mixed (got {self.asked})")
        numbers = 9 * 10 ** (self.key_digits - 1)  # the first digit is never 0
        distinct = max(self.distractors + 1, self.needles, self.values, self.chains)
        if distinct > numbers // 2:
            raise ConfigError(f"data.synthetic.key_digits={self.key_digits} gives {numbers} numbers, too few for "
                              f"{distinct} distinct numbers per instance (distractors + key, needles, values or "
                              "chains); use more key_digits")
        names = 26 ** self.name_letters
        wanted = max(self.needles, self.chains * (self.hops + 1))
        if wanted > names // 2:
            raise ConfigError(f"data.synthetic.name_letters={self.name_letters} gives {names} names, too few for "
                              f"{wanted} distinct names per instance; use more name_letters or fewer needles/chains")

    def for_tasks(self, tasks: typing.Sequence[str]) -> "SyntheticConfig":
        """These settings checked against the tasks actually built from them, where those are
        not ``tasks`` (a text run's ``data.mix.tasks``; data.synthetic.tasks keeps its default)."""
        if list(tasks) == list(self.tasks):
            return self
        try:
            return dataclasses.replace(self, tasks=list(tasks))
        except ConfigError as e:
            raise ConfigError(f"{e} (checked against the tasks built from data.synthetic: "
                              f"{', '.join(tasks)})") from None

    def scored_as(self, asked: Optional[int], tasks: typing.Sequence[str]) -> "SyntheticConfig":
        """These settings as ``tasks`` are scored with ``asked`` questions per multikey/vartrack
        instance (``eval.tasks.asked``; None: as trained): the one place both the evaluation
        (eval/tasks/exact_match.py) and the competence stop (training/data.py) make that override, checked
        against the tasks actually scored (a text run's mixed tasks, not data.synthetic.tasks)."""
        built = self.for_tasks(tasks)
        if asked is None or asked == built.asked:
            return built
        try:
            return dataclasses.replace(built, asked=asked)
        except ConfigError as e:
            raise ConfigError(f"eval.tasks.asked={asked}, the questions scored per instance: {e}") from None

    def asked_of(self, total: int) -> int:
        """Questions per instance of a task with ``total`` needles or chains."""
        return total if self.asked in ("all", "mixed") else self.asked

    @property
    def n_queries(self) -> int:
        return self.pairs if self.queries is None else self.queries


@dataclass
class MixConfig:
    """Retrieval instances mixed into a text run's training batches (``data.mix``).

    In every batch, ``round(fraction x batch_size)`` rows are task instances (each of
    ``tasks`` drawn uniformly, with ``data.synthetic``'s parameters, in the plain wording of
    data/tasks/haystack.py written with the run's own tokenizer; their answer tokens alone
    are targets) and the rest are text windows, so the model retrieves at its training
    length while its perplexity stays a language model's. Validation is on text alone.

    ``loss_share``: the share of each batch's loss that the task rows' answer tokens carry,
    the text rows' tokens the rest (each group a mean over its own targets). By default the
    task rows' share of the batch's rows: a row counts alike whichever it is. A plain mean
    over all targets would give a task row's few answer tokens a tiny part of the loss
    (passkey at L = 128: 5 answer tokens against 128 text tokens a row, so half the rows
    would carry 4% of it).
    """

    tasks: list[TaskName] = field(default_factory=list)
    fraction: float = 0.0
    loss_share: Optional[float] = None

    def __post_init__(self) -> None:
        if bool(self.tasks) != (self.fraction > 0):
            raise ConfigError(f"data.mix.tasks and data.mix.fraction go together: name the tasks to mix in and "
                              f"the share of each batch they take, or neither (got tasks={self.tasks}, "
                              f"fraction={self.fraction})")
        if not 0.0 <= self.fraction < 1.0:
            raise ConfigError(f"data.mix.fraction must be in [0, 1): the share of each batch's rows that are "
                              f"task instances (got {self.fraction})")
        wrong = [t for t in self.tasks if t not in RETRIEVAL_TASKS]
        if wrong:
            raise ConfigError(f"data.mix.tasks can hold the retrieval tasks {', '.join(RETRIEVAL_TASKS)}, which are "
                              f"written in plain words a text tokenizer can write; {', '.join(wrong)} exist only in the "
                              "synthetic task alphabet (train on data.source=synthetic for them)")
        if len(set(self.tasks)) != len(self.tasks):
            raise ConfigError(f"data.mix.tasks lists a task twice: {self.tasks}")
        if self.loss_share is not None:
            if not self.tasks:
                raise ConfigError("data.mix.loss_share is the mixed tasks' share of the loss; set data.mix.tasks "
                                  "and data.mix.fraction too, or leave it out")
            if not 0.0 < self.loss_share < 1.0:
                raise ConfigError(f"data.mix.loss_share must be in (0, 1): the share of each batch's loss the "
                                  f"task rows carry, the text rows the rest (got {self.loss_share}); leave it out "
                                  "for the task rows' share of the batch")


# data.synthetic keys a variant may not set, and the eval.tasks key that does what was meant.
_NOT_VARIED = {"tasks": "eval.tasks.tasks picks the tasks scored",
               "asked": "eval.tasks.asked sets the questions scored per instance"}


def _check_variant(self) -> None:
    """What a variant can be checked for alone (the rest once it meets a run's settings: varied)."""
    for key, instead in _NOT_VARIED.items():
        if getattr(self, key) is not None:
            raise ConfigError(f"eval.tasks.variant.{key} cannot be set: {instead}")
    check_counts("eval.tasks.variant", dataclasses.asdict(self))
    if self.queries is not None and self.queries < 1:
        raise ConfigError(f"eval.tasks.variant.queries must be a positive integer (got {self.queries})")


def _variant_class() -> type:
    """TaskVariantConfig: every data.synthetic key, each optional (null: the run's own), so a
    variant is checked (keys, types) as any other section is."""
    hints = typing.get_type_hints(SyntheticConfig)
    fields = [(f.name, Optional[hints[f.name]], field(default=None)) for f in dataclasses.fields(SyntheticConfig)]
    return dataclasses.make_dataclass("TaskVariantConfig", fields, namespace={
        "__doc__": "Task settings that scored instances use instead of the run's own data.synthetic "
                   "(``eval.tasks.variant``; null or absent: the run's own).",
        "__post_init__": _check_variant,
        "given": lambda self: {k: v for k, v in dataclasses.asdict(self).items() if v is not None},
        "__module__": __name__})


TaskVariantConfig = _variant_class()


# The data.synthetic keys each task is built from (data/tasks/__init__.py: build_task); a key no
# scored task reads leaves the instances the run's own.
TASK_KEYS: dict[str, tuple[str, ...]] = {
    "passkey": ("key_digits", "distractors", "spaced"),
    "copy": (),
    "recall": ("pairs", "queries"),
    "addition": ("addition_layout",),
    "multikey": ("needles", "key_digits", "name_letters", "asked", "spaced"),
    "multivalue": ("values", "key_digits", "name_letters", "spaced"),
    "vartrack": ("chains", "hops", "key_digits", "name_letters", "asked", "spaced", "vartrack_answer",
                 "vartrack_question"),
}


def varied(synthetic: SyntheticConfig, variant) -> SyntheticConfig:
    """``synthetic`` with the keys a variant sets (eval.tasks.variant), checked as data.synthetic is;
    a key none of ``synthetic.tasks`` (the tasks scored) reads is refused: it would change no
    instance, while the report said the instances differ from training."""
    given = variant.given()
    if not given:
        return synthetic
    read = {key for task in synthetic.tasks for key in TASK_KEYS[task]}
    unused = [key for key in given if key not in read]
    if unused:
        uses = "; ".join(f"{task} reads {', '.join(TASK_KEYS[task]) or 'none'}" for task in synthetic.tasks)
        raise ConfigError(f"eval.tasks.variant sets {', '.join(unused)}, which no task scored here reads ({uses}), "
                          "so the instances would be the run's own; remove it, or score a task that reads it "
                          "(eval.tasks.tasks, --tasks)")
    try:
        return dataclasses.replace(synthetic, **given)
    except ConfigError as e:
        settings = ", ".join(f"{k}={v}" for k, v in given.items())
        raise ConfigError(f"eval.tasks.variant ({settings}), the task settings scored instead of the run's own: "
                          f"{e}") from None


@dataclass
class TaskEvalConfig:
    """Exact-match accuracy on synthetic tasks (``ropelab tasks``; key ``eval.tasks``).

    Lengths and RoPE scalings are the enclosing EvalConfig's (``eval.lengths`` or
    ``eval.length_multipliers`` x train.seq_len, ``eval.scalings``), shared with the
    perplexity sweep. ``samples`` instances are scored per length, and for passkey and
    multikey per (length, depth) cell. Test instances are a pure function of ``seed``, the task, the
    length, the depth and the instance index, so every run is scored on the same ones.
    """

    # Empty: the run's own tasks (synthetic runs), else those of its data.mix, else passkey.
    tasks: list[TaskName] = field(default_factory=list)
    samples: int = 100
    # Passkey and multikey: where the (queried) needle sits, as the fraction of the filler before
    # it (0: first, 1: last).
    depths: list[float] = field(default_factory=lambda: [0.0, 0.25, 0.5, 0.75, 1.0])
    # k_max (Chen et al. 2023): retrieval "succeeds" in a cell whose accuracy is at least this.
    kmax_threshold: float = 0.2
    # Multikey and vartrack: needles (chains) asked per scored instance (null: the run's own
    # data.synthetic.asked). 1 scores RULER's multi-key (one needle queried) on a model trained
    # on its multi-query.
    asked: Optional[int] = None
    # Score a variant of each run's task: data.synthetic keys set here replace the run's own in
    # the scored instances (e.g. {chains: 1} for variable tracking with one chain, {distractors: 8}
    # for a passkey among more numbers), so one trained model is measured on easier or harder
    # settings. Learning (learned_accuracy) is then judged on the variant; the competence stop of
    # training never uses it.
    variant: TaskVariantConfig = field(default_factory=TaskVariantConfig)
    seed: int = 0
    # The report's settings (they change no scored number, so no cache key): a seed has
    # learned a task when its accuracy at the reference length is at least learned_accuracy,
    # and beyond-L accuracies pool the seeds that learned it (null: every seed); a row's
    # effective length is the longest evaluated length up to which its accuracy stays at least
    # effective_fraction x its accuracy at the reference length (eval/tasks/effective_length.py);
    # the reference length is reference_length, or null for the run's train.seq_len.
    learned_accuracy: Optional[float] = 0.95
    effective_fraction: float = 0.8
    reference_length: Optional[int] = None

    def __post_init__(self) -> None:
        if self.samples < 1:
            raise ConfigError(f"eval.tasks.samples must be a positive integer (got {self.samples})")
        if not self.depths:
            raise ConfigError("eval.tasks.depths must list at least one passkey depth in [0, 1]")
        bad = [d for d in self.depths if not 0.0 <= d <= 1.0]
        if bad:
            raise ConfigError(f"eval.tasks.depths must be in [0, 1] (0: key first, 1: key right before "
                              f"the question); got {bad}")
        if not 0.0 < self.kmax_threshold <= 1.0:
            raise ConfigError(f"eval.tasks.kmax_threshold must be in (0, 1] (got {self.kmax_threshold})")
        if len(set(self.tasks)) != len(self.tasks):
            raise ConfigError(f"eval.tasks.tasks lists a task twice: {self.tasks}")
        if self.seed < 0:
            raise ConfigError(f"eval.tasks.seed must be 0 or more (got {self.seed})")
        if self.asked is not None and self.asked < 1:
            raise ConfigError(f"eval.tasks.asked must be a positive integer, or null for the run's own "
                              f"data.synthetic.asked (got {self.asked})")
        if self.learned_accuracy is not None and not 0.0 < self.learned_accuracy <= 1.0:
            raise ConfigError(f"eval.tasks.learned_accuracy must be in (0, 1], or null to pool every seed "
                              f"(got {self.learned_accuracy})")
        if not 0.0 < self.effective_fraction <= 1.0:
            raise ConfigError(f"eval.tasks.effective_fraction must be in (0, 1] (got {self.effective_fraction})")
        if self.reference_length is not None and self.reference_length < 1:
            raise ConfigError(f"eval.tasks.reference_length must be a positive length, or null for train.seq_len "
                              f"(got {self.reference_length})")

    def resolved_depths(self) -> list[float]:
        return sorted(set(self.depths))


# Keys of TaskEvalConfig that only shape the report: results cached before they existed stay valid.
REPORT_KEYS: tuple[str, ...] = ("learned_accuracy", "effective_fraction", "reference_length")
