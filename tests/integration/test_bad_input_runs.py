"""A run directory whose parts no longer agree, or are damaged, met by every command that
reads one: evaluation (eval.extrapolation, eval.tasks, scripts/diagnose.py), sampling,
export, fine-tuning from it (init.run) and resuming it. Each refuses with exit 2 and the
damage named, and leaves every file of the run as it was; where the message advises
something, a test does it and the command then works.

Damages: a config.yaml edited after training (the weights load the same either way, so
only the fingerprint recorded in the checkpoint tells: training/consistency.py), a
tokenizer swapped for another of the same size, weights files exchanged between
checkpoints (only their recorded digest tells: training/checkpoint.py), NaN weights,
checkpoints that do not read, and the missing or misplaced parts of a run.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Callable

import pytest

from ropelab import train
from helpers.bad_input import follow, refused_in_process, rewrite_latest_weights, snapshot
from helpers.runs import write_run_config
from ropelab.data.tokenizers import CharTokenizer, load_tokenizer
from ropelab.eval.lm import extrapolation
from ropelab.eval.tasks import exact_match
from ropelab.scripts import diagnose
from ropelab.scripts import export_hf
from ropelab.scripts import sample


@pytest.fixture(scope="module")
def trained(tmp_path_factory, corpus) -> tuple[Path, Path]:
    """(config, run directory) of a tiny run with checkpoints at steps 5 and 10 and best/."""
    tmp = tmp_path_factory.mktemp("runs-damaged")
    cfg = write_run_config(tmp, corpus)
    assert train.main([str(cfg), "train.max_steps=10", "train.ckpt_interval=5", "train.eval_interval=5"]) == 0
    return cfg, tmp / "runs" / "tiny"


# --------------------------------------------------------------- damages

def edit_config(run: Path) -> None:
    text = (run / "config.yaml").read_text()
    assert "    kind: rope\n" in text
    (run / "config.yaml").write_text(text.replace("    kind: rope\n", "    kind: alibi\n", 1))


def swap_tokenizer(run: Path) -> None:
    """Another tokenizer of the same size: only its fingerprint can tell."""
    size = load_tokenizer(run / "tokenizer.json").vocab_size
    (run / "tokenizer.json").write_text(CharTokenizer([chr(0x100 + i) for i in range(size - 1)]).to_json())


def poison_latest(run: Path) -> None:
    """NaN in the newest checkpoint's weights, saved as a checkpoint records them (what a
    divergence saved by a version without the loss check leaves)."""
    rewrite_latest_weights(run, lambda tensors: tensors["blocks.0.attn.wo.weight"][0, :1].fill_(float("nan")))


def swap_weights(run: Path) -> None:
    """The two checkpoints' weights files exchanged: the same shapes, finite, each another
    checkpoint's; only the digest meta.json recorded can tell."""
    a, b = sorted((run / "checkpoints").glob("step_*/model.safetensors"))
    data = a.read_bytes()
    a.write_bytes(b.read_bytes())
    b.write_bytes(data)


def truncate_all(run: Path) -> None:
    for path in (run / "checkpoints").glob("step_*/model.safetensors"):
        path.write_bytes(path.read_bytes()[:100])


def drop_checkpoints(run: Path) -> None:
    shutil.rmtree(run / "checkpoints")
    shutil.rmtree(run / "best")


def replace_with_file(run: Path) -> None:
    shutil.rmtree(run)
    run.write_text("not a run\n")


def empty(run: Path) -> None:
    shutil.rmtree(run)
    run.mkdir()


DAMAGES: dict[str, tuple[Callable[[Path], None], str]] = {
    "edited-config": (edit_config, "model.pos.kind: 'rope' in training, 'alibi' now"),
    "swapped-tokenizer": (swap_tokenizer, "is not the tokenizer"),
    "deleted-tokenizer": (lambda run: (run / "tokenizer.json").unlink(), "tokenizer.json"),
    "nan-weights": (poison_latest, "holds non-finite weights (1 NaN or infinite values, in blocks.0.attn.wo.weight)"),
    "swapped-weights": (swap_weights, "model.safetensors is not the file step_000010 saved"),
    "unreadable-checkpoints": (truncate_all, "can be read"),
    "no-checkpoint": (drop_checkpoints, "has no checkpoint yet"),
    "no-config": (lambda run: (run / "config.yaml").unlink(), "not a run directory"),
    "a-file": (replace_with_file, "is a file"),
    "empty-directory": (empty, "not a run directory"),
}

# Each command that reads a run: (main, argv for the run at RUN with scratch space at TMP).
COMMANDS: dict[str, tuple[Callable, Callable[[Path, Path, Path], list[str]]]] = {
    "eval.extrapolation": (extrapolation.main, lambda cfg, run, tmp: [
        str(run), "--lengths", "32", "--max-tokens", "300", "--out", str(tmp / "report")]),
    "eval.tasks": (exact_match.main, lambda cfg, run, tmp: [
        str(run), "--lengths", "256", "--samples", "1", "--depths", "0.5", "--out", str(tmp / "report")]),
    "diagnose": (diagnose.main, lambda cfg, run, tmp: [
        str(run), "--lengths", "32", "--windows", "1", "--out", str(tmp / "report")]),
    "sample": (sample.main, lambda cfg, run, tmp: [str(run), "--max-new-tokens", "3", "--seed", "0"]),
    "export": (export_hf.main, lambda cfg, run, tmp: [str(run), str(tmp / "hf")]),
    "init.run": (train.main, lambda cfg, run, tmp: [
        str(cfg), f"out_dir={tmp / 'children'}", "name=child", f"init.run={run}", "train.max_steps=2"]),
}
# Where a message says something else than the damage's own words for a command.
SAYS = {("init.run", "a-file"): "not a run directory"}


def damaged(trained, tmp_path: Path, damage: str) -> Path:
    _, run = trained
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    DAMAGES[damage][0](copy)
    return copy


@pytest.mark.parametrize("damage", DAMAGES)
@pytest.mark.parametrize("command", COMMANDS)
def test_a_damaged_run_is_refused_by_every_command(trained, tmp_path, capsys, command, damage):
    copy = damaged(trained, tmp_path, damage)
    before = snapshot(copy)
    main, argv = COMMANDS[command]
    refused_in_process(main, argv(trained[0], copy, tmp_path), capsys,
                       SAYS.get((command, damage), DAMAGES[damage][1]))
    assert snapshot(copy) == before
    assert not (tmp_path / "report").exists() and not (tmp_path / "hf").exists()
    assert not (tmp_path / "children" / "child").exists()


def resume(copy: Path, *extra: str) -> list[str]:
    """train.py --resume of a copied run (its config names the original's directory)."""
    return [str(copy / "config.yaml"), f"out_dir={copy.parent}", f"name={copy.name}", "--resume", *extra]


@pytest.mark.parametrize("damage, fragment", [
    ("edited-config", "was trained with other settings than this command gives (model.pos.kind: 'rope' in "
                      "training, 'alibi' now)"),
    ("nan-weights", "holds non-finite weights"),
    ("swapped-weights", "is not the file step_000010 saved"),
    ("unreadable-checkpoints", "no checkpoint of"),
], ids=["edited-config", "nan-weights", "swapped-weights", "unreadable-checkpoints"])
def test_a_damaged_run_is_not_resumed(trained, tmp_path, capsys, damage, fragment):
    copy = damaged(trained, tmp_path, damage)
    before = snapshot(copy)
    refused_in_process(train.main, resume(copy, "train.max_steps=12"), capsys, fragment)
    assert snapshot(copy) == before


@pytest.mark.parametrize("damage", ["swapped-tokenizer", "deleted-tokenizer"])
def test_resuming_restores_a_tokenizer_from_the_data(trained, tmp_path, damage):
    """Training prepares its tokenizer from the data, so a resume is unaffected by a swapped
    or lost tokenizer.json, and writes the run's own back."""
    copy = damaged(trained, tmp_path, damage)
    assert train.main(resume(copy, "train.max_steps=12")) == 0
    assert (copy / "tokenizer.json").read_bytes() == (trained[1] / "tokenizer.json").read_bytes()


# --------------------------------------------------------------- the advice, followed

def test_an_edited_config_works_again_once_its_value_is_put_back(trained, tmp_path, capsys):
    copy = damaged(trained, tmp_path, "edited-config")
    refused_in_process(sample.main, [str(copy), "--max-new-tokens", "2"], capsys, f"Put those values back in {copy}")
    text = (copy / "config.yaml").read_text()
    (copy / "config.yaml").write_text(text.replace("    kind: alibi\n", "    kind: rope\n", 1))
    assert sample.main([str(copy), "--max-new-tokens", "2", "--seed", "0"]) == 0


def test_a_swapped_tokenizer_is_restored_by_the_command_given(trained, tmp_path, capsys):
    copy = damaged(trained, tmp_path, "swapped-tokenizer")
    err = refused_in_process(sample.main, [str(copy), "--max-new-tokens", "2"], capsys, "restore it: cp ")
    source, target = err.split("restore it: cp ")[1].split()[:2]
    shutil.copyfile(source, target)
    assert sample.main([str(copy), "--max-new-tokens", "2", "--seed", "0"]) == 0


def test_swapped_weights_work_again_once_the_originals_are_put_back(trained, tmp_path, capsys):
    copy = damaged(trained, tmp_path, "swapped-weights")
    refused_in_process(sample.main, [str(copy), "--max-new-tokens", "2"], capsys, "put the original file back")
    swap_weights(copy)  # the advice: each checkpoint's own file back in place
    assert sample.main([str(copy), "--max-new-tokens", "2", "--seed", "0"]) == 0


def test_unreadable_checkpoints_of_a_parent_are_trained_again_as_advised(trained, tmp_path, capsys):
    """init.run of a parent whose checkpoints do not read: the advice (move it aside, train
    it again from its own config) gives a parent the same command then starts from."""
    cfg, _ = trained
    copy = damaged(trained, tmp_path, "unreadable-checkpoints")
    child = [str(cfg), f"out_dir={tmp_path / 'children'}", "name=child", f"init.run={copy}", "train.max_steps=2"]
    err = refused_in_process(train.main, child, capsys, f"init.run={copy}", "Train it again: mv ")
    assert "--resume" not in err
    assert follow(err, capsys) == 0
    assert train.main(child) == 0


def test_nan_weights_are_carried_on_from_the_last_finite_checkpoint(trained, tmp_path, capsys):
    """The advice for a NaN checkpoint: a new run from the newest finite one (step 5), which
    trains, records its parent, and evaluates."""
    copy = damaged(trained, tmp_path, "nan-weights")
    err = refused_in_process(extrapolation.main, [str(copy), "--lengths", "32", "--out", str(tmp_path / "r")], capsys,
                             "Carry on from step 5", "init.step=5")
    assert follow(err, capsys) == 0
    (child,) = [p for p in tmp_path.iterdir() if p.name.startswith("run-from5-lr")]
    meta = (child / "checkpoints" / "latest").read_text().strip()
    assert meta == "step_000005"  # the 10 - 5 steps that were left
    assert extrapolation.main([str(child), "--lengths", "32", "--max-tokens", "300",
                               "--out", str(tmp_path / "report")]) == 0


def test_a_deleted_best_checkpoint_is_not_mistaken_for_no_validation(trained, tmp_path, capsys):
    _, run = trained
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    shutil.rmtree(copy / "best")
    refused_in_process(sample.main, [str(copy), "--which", "best"], capsys,
                       "although validation has run", "deleted or moved", "--which latest")
    assert sample.main([str(copy), "--which", "latest", "--max-new-tokens", "2", "--seed", "0"]) == 0


def test_fingerprints_are_recorded_and_older_checkpoints_load_without(trained, tmp_path):
    """Checkpoints written before the fingerprints existed carry none and load as before."""
    _, run = trained
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    for meta_path in copy.glob("checkpoints/step_*/meta.json"):
        meta = json.loads(meta_path.read_text())
        assert meta["experiment"]["model.pos.kind"] == "rope" and len(meta["tokenizer_sha256"]) == 64
        meta_path.write_text(json.dumps({k: v for k, v in meta.items() if k not in ("experiment", "tokenizer_sha256")}))
    edit_config(copy)  # undetectable without a fingerprint: such a run loads as its config says
    assert sample.main([str(copy), "--max-new-tokens", "2", "--seed", "0"]) == 0
