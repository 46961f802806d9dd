"""One definition of "the same experiment", shared by resume, ablate's status and seed pooling."""

from __future__ import annotations

import pytest

from ropelab import train
from ropelab.configs import load_config
from ropelab.configs.experiment import MAY_DIFFER, experiment_differences, experiment_identity, seed_group
from ropelab.configs.grid import load_grid
from helpers.runs import write_grid, write_run_config

from ropelab.grid.run_state import status

QUICK = "configs/quickstart.yaml"


@pytest.mark.parametrize("override", ["train.max_steps=5000", "train.eval_interval=7", "train.device=cpu",
                                      "data.cache_dir=/elsewhere", "data.num_proc=1", "eval.lengths=[64]",
                                      "log.wandb=true", "name=other", "out_dir=elsewhere"])
def test_keys_that_do_not_change_what_is_trained(override):
    assert experiment_differences(load_config(QUICK), load_config(QUICK, [override])) == []


@pytest.mark.parametrize("override,key", [("train.lr=3e-4", "train.lr"), ("model.d_model=64", "model.d_model"),
                                          ("data.tokenizer.vocab_size=4096", "data.tokenizer.vocab_size"),
                                          ("model.pos.rope.theta=500000", "model.pos.rope.theta"),
                                          ("train.seed=3", "train.seed")])
def test_keys_that_do(override, key):
    assert experiment_differences(load_config(QUICK), load_config(QUICK, [override])) == [key]


def test_seeds_share_a_group_and_nothing_else_does():
    base = load_config(QUICK)
    assert seed_group(base) == seed_group(load_config(QUICK, ["train.seed=9", "train.max_steps=10"]))
    assert seed_group(base) != seed_group(load_config(QUICK, ["model.pos.kind=alibi"]))
    assert all(k.split(".")[0] in ("name", "out_dir", "eval", "log", "model", "data", "train") for k in MAY_DIFFER)


def test_ablate_and_resume_agree_when_a_grid_extends_its_runs(tmp_path, corpus):
    """Raising a grid's max_steps: ablate says partial and train.py --resume continues the run."""
    base = write_run_config(tmp_path, corpus)
    grid_path = write_grid(tmp_path, name="g", base=base,
                           overrides=["train.max_steps=6", "train.eval_interval=6", "train.ckpt_interval=6"],
                           axes={"train.seed": [1]})
    run = load_grid(grid_path).plan()[0]
    assert train.main([str(base), *run.overrides]) == 0
    assert status(run) == ("done", "step 6")
    longer = load_grid(grid_path).plan(["train.max_steps=9"])[0]
    assert status(longer) == ("partial", "step 6/9")
    assert train.main([str(base), *longer.overrides, "--resume"]) == 0
    assert status(longer) == ("done", "step 9")
    # A change that makes another experiment is a conflict for both.
    other = load_grid(grid_path).plan(["train.max_steps=9", "train.lr=1e-2"])[0]
    state, detail = status(other)
    assert state == "conflict" and "train.lr" in detail
    assert train.main([str(base), *other.overrides, "--resume"]) == 2


def test_grid_eval_is_typed_and_reaches_every_run(tmp_path, corpus):
    base = write_run_config(tmp_path, corpus)
    good = write_grid(tmp_path, name="g", base=base, file="good", out_dir=None, axes={"train.seed": [1, 2]},
                      eval={"lengths": [16, 64], "scalings": ["none", "yarn"], "max_tokens": 512})
    runs = load_grid(good).plan()
    assert all(r.cfg.eval.lengths == [16, 64] and r.cfg.eval.scalings == ["none", "yarn"] for r in runs)
    for bad, message in (("{lengths: [a]}", "eval.lengths[0] must be an integer"),
                         ("{lenghts: [16]}", "did you mean 'eval.lengths'"),
                         ("{stride: 0}", "eval.stride must be a positive integer")):
        path = write_grid(tmp_path, name="g", base=base, file="bad", out_dir=None, axes={"train.seed": [1]}, eval=bad)
        with pytest.raises(Exception, match=message.replace("[", r"\[").replace("]", r"\]")) as info:
            load_grid(path)
        assert "bad.yaml" in str(info.value)


def test_the_questions_a_competence_stop_scores_make_another_experiment():
    """eval.tasks.asked steers training only through train.stop_at_accuracy: with the stop
    it decides when a run ends (training/competence.py), without it it is evaluation alone."""
    synthetic = "configs/synthetic-cpu.yaml"
    stop = ["data.synthetic.tasks=[multikey]", "data.synthetic.asked=mixed", "train.stop_at_accuracy=0.95"]
    assert experiment_differences(load_config(synthetic, stop),
                                  load_config(synthetic, [*stop, "eval.tasks.asked=1"])) == ["eval.tasks.asked"]
    assert experiment_differences(load_config(synthetic, stop[:2]),
                                  load_config(synthetic, [*stop[:2], "eval.tasks.asked=1"])) == []
    # Asking what the run trained on is scoring it as trained: the same stop, the same experiment.
    as_trained = [*stop[:1], "data.synthetic.asked=2", "data.synthetic.needles=3", *stop[2:]]
    assert experiment_differences(load_config(synthetic, as_trained),
                                  load_config(synthetic, [*as_trained, "eval.tasks.asked=2"])) == []
    assert seed_group(load_config(synthetic, stop)) != seed_group(load_config(synthetic, [*stop, "eval.tasks.asked=1"]))


def test_data_order_has_its_own_seed_and_runs_without_it_stay_what_they_were():
    from ropelab.configs.schema import RunConfig, TrainConfig
    base = RunConfig()
    assert "train.data_seed" not in experiment_identity(base)  # unset: the identity of every earlier run
    assert base.train.data_order_seed == base.train.seed
    fixed = RunConfig(train=TrainConfig(seed=3, data_seed=0))
    assert fixed.train.data_order_seed == 0
    assert experiment_differences(base, fixed) == ["train.data_seed", "train.seed"]
    assert seed_group(fixed) == seed_group(RunConfig(train=TrainConfig(seed=5, data_seed=1)))  # replicates pool
