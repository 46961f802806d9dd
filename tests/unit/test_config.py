"""Config loading: inheritance, overrides, strict keys and types, value checks, round trips."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml

from ropelab.configs import config_from_dict, config_to_dict, load_config, save_config
from ropelab.configs.schema import RunConfig
from ropelab.model.config import POS_KINDS
from ropelab.common.errors import ConfigError

from helpers import ROOT

CONFIG_DIR = ROOT / "configs"
PRESETS = sorted(p for p in CONFIG_DIR.rglob("*.yaml") if "ablations" not in p.relative_to(CONFIG_DIR).parts)  # grids: test_ablate


def write(path: Path, data: dict | str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data))
    return path


# ------------------------------------------------------------------ inheritance and merge

def test_inheritance_order_and_deep_merge(tmp_path):
    write(tmp_path / "a.yaml", {"name": "a", "model": {"d_model": 64, "n_heads": 4, "n_layers": 3},
                                "train": {"lr": 0.01}})
    write(tmp_path / "sub" / "b.yaml", {"name": "b", "model": {"n_layers": 5, "pos": {"kind": "alibi"}}})
    child = write(tmp_path / "child.yaml", {"inherit": ["a.yaml", "sub/b.yaml"],
                                            "model": {"d_model": 96}})
    cfg = load_config(child)
    assert cfg.name == "b"                      # later parent wins
    assert cfg.model.n_layers == 5              # later parent wins inside a mapping
    assert cfg.model.n_heads == 4               # earlier parent's sibling keys survive
    assert cfg.model.d_model == 96              # the file itself wins over its parents
    assert cfg.model.pos.kind == "alibi"
    assert cfg.train.lr == 0.01


def test_inherit_paths_relative_to_the_inheriting_file(tmp_path):
    write(tmp_path / "base.yaml", {"train": {"seq_len": 64}})
    write(tmp_path / "deep" / "mid.yaml", {"inherit": "../base.yaml", "train": {"batch_size": 3}})
    leaf = write(tmp_path / "deep" / "more" / "leaf.yaml", {"inherit": "../mid.yaml"})
    cfg = load_config(leaf)
    assert (cfg.train.seq_len, cfg.train.batch_size) == (64, 3)


def test_lists_are_replaced_not_merged(tmp_path):
    write(tmp_path / "a.yaml", {"eval": {"lengths": [1, 2, 3]}})
    child = write(tmp_path / "b.yaml", {"inherit": "a.yaml", "eval": {"lengths": [7]}})
    assert load_config(child).eval.lengths == [7]


def test_inheritance_cycle_and_missing_parent(tmp_path):
    write(tmp_path / "a.yaml", {"inherit": "b.yaml"})
    write(tmp_path / "b.yaml", {"inherit": "a.yaml"})
    with pytest.raises(ConfigError, match="cycle"):
        load_config(tmp_path / "a.yaml")
    write(tmp_path / "c.yaml", {"inherit": "nope.yaml"})
    with pytest.raises(ConfigError, match="nope.yaml"):
        load_config(tmp_path / "c.yaml")


def test_several_files_merge_in_order():
    cfg = load_config([CONFIG_DIR / "quickstart.yaml", CONFIG_DIR / "pe" / "alibi.yaml"])
    assert cfg.model.pos.kind == "alibi" and cfg.model.d_model == 128 and cfg.name == "quickstart"


# ------------------------------------------------------------------ overrides

def test_overrides_nested_lists_and_null(tmp_path):
    cfg = load_config(CONFIG_DIR / "quickstart.yaml", [
        "model.pos.kind=alibi", "train.max_steps=200", "eval.lengths=[128,256]",
        "model.n_kv_heads=null", "model.pos.rope.scaling.factor=2", "train.lr=3e-4",
        "data.local.train=[a.txt, 'b c.txt']"])
    assert cfg.model.pos.kind == "alibi"
    assert cfg.train.max_steps == 200
    assert cfg.eval.lengths == [128, 256]
    assert cfg.model.n_kv_heads is None
    assert cfg.model.pos.rope.scaling.factor == 2.0 and isinstance(cfg.model.pos.rope.scaling.factor, float)
    assert cfg.train.lr == 3e-4  # YAML 1.1 reads 3e-4 as a string; numeric fields accept it
    assert cfg.data.local.train == ["a.txt", "b c.txt"]


def test_override_wins_over_files_and_later_override_wins():
    cfg = load_config(CONFIG_DIR / "quickstart.yaml", ["train.seq_len=64", "train.seq_len=32"])
    assert cfg.train.seq_len == 32


@pytest.mark.parametrize("bad", ["model.pos.kind", "=3", "model..x=1", "inherit=base.yaml"])
def test_malformed_overrides(bad):
    with pytest.raises(ConfigError, match="override"):
        load_config(CONFIG_DIR / "quickstart.yaml", [bad])


# ------------------------------------------------------------------ unknown keys

def test_unknown_key_in_file_names_file_and_suggests(tmp_path):
    path = write(tmp_path / "typo.yaml", {"inherit": str(CONFIG_DIR / "quickstart.yaml"),
                                          "model": {"n_layer": 2}})
    with pytest.raises(ConfigError) as e:
        load_config(path)
    msg = str(e.value)
    assert "typo.yaml" in msg and "model.n_layer" in msg and "did you mean 'model.n_layers'" in msg


def test_unknown_key_in_inherited_file_names_that_file(tmp_path):
    write(tmp_path / "parent.yaml", {"train": {"warmup": 5}})
    child = write(tmp_path / "child.yaml", {"inherit": "parent.yaml", "name": "x"})
    with pytest.raises(ConfigError, match=r"parent\.yaml.*train\.warmup.*train\.warmup_steps"):
        load_config(child)


def test_unknown_key_in_override_names_override_and_suggests():
    with pytest.raises(ConfigError) as e:
        load_config(CONFIG_DIR / "quickstart.yaml", ["model.pos.knd=alibi"])
    msg = str(e.value)
    assert "override 'model.pos.knd=alibi'" in msg and "did you mean 'model.pos.kind'" in msg


def test_unknown_section_and_misplaced_key_suggestions():
    with pytest.raises(ConfigError, match="did you mean 'train'"):
        load_config(CONFIG_DIR / "quickstart.yaml", ["trian.lr=0.1"])
    with pytest.raises(ConfigError, match="did you mean 'train.seq_len'"):
        load_config(CONFIG_DIR / "quickstart.yaml", ["seq_len=64"])


# ------------------------------------------------------------------ types

@pytest.mark.parametrize("override, key", [
    ("train.batch_size=abc", "train.batch_size"),    # a string for an int
    ("train.batch_size=2.5", "train.batch_size"),    # a float with a fraction for an int
    ("train.batch_size=true", "train.batch_size"),   # bool is not an int
    ("train.lr=true", "train.lr"),                   # nor a float
    ("train.compile=1", "train.compile"),            # an int is not a bool
    ("name=123", "name"),
    ("eval.lengths=128", "eval.lengths"),            # a scalar for a list
    ("eval.lengths=[128,x]", "eval.lengths[1]"),
    ("eval.protocols=sliding", "eval.protocols"),    # one choice is not a list of choices
    ("data.local.train=3", "data.local.train"),      # nor a number a list of paths
    ("model.pos=alibi", "model.pos"),                # a scalar for a section
])
def test_wrong_types_rejected(override, key):
    with pytest.raises(ConfigError) as e:
        load_config(CONFIG_DIR / "quickstart.yaml", [override])
    assert f"{key} must be" in str(e.value) and f"override '{override}'" in str(e.value)


def test_one_path_where_a_list_of_paths_is_expected(tmp_path):
    """README: data.local.* take files, directories or globs; one of them needs no brackets."""
    cfg = load_config(CONFIG_DIR / "quickstart.yaml", ["data.source=local", "data.local.train=corpus/train.txt",
                                                       "data.local.valid=corpus/valid.txt"])
    assert cfg.data.local.train == ["corpus/train.txt"] and cfg.data.local.valid == ["corpus/valid.txt"]
    child = write(tmp_path / "local.yaml", {"inherit": str(CONFIG_DIR / "quickstart.yaml"), "data": {
        "source": "local", "local": {"train": "books/*.txt", "valid_fraction": 0.1}}})
    assert load_config(child).data.local.train == ["books/*.txt"]
    listed = load_config(CONFIG_DIR / "quickstart.yaml", ["data.source=local", "data.local.train=[a.txt, b.txt]",
                                                           "data.local.valid_fraction=0.1"])
    assert listed.data.local.train == ["a.txt", "b.txt"]


def test_literal_lists_allowed_values():
    with pytest.raises(ConfigError) as e:
        load_config(CONFIG_DIR / "quickstart.yaml", ["model.pos.kind=rotary"])
    for allowed in POS_KINDS:
        assert repr(allowed) in str(e.value)
    with pytest.raises(ConfigError, match="'nonoverlap'"):
        load_config(CONFIG_DIR / "quickstart.yaml", ["eval.protocols=[sliding, chunked]"])


def test_whole_floats_accepted_for_ints():
    cfg = load_config(CONFIG_DIR / "quickstart.yaml", ["train.max_steps=2.0", "train.warmup_steps=1e2"])
    assert cfg.train.max_steps == 2 and isinstance(cfg.train.max_steps, int)
    assert cfg.train.warmup_steps == 100 and isinstance(cfg.train.warmup_steps, int)


# ------------------------------------------------------------------ impossible values

@pytest.mark.parametrize("overrides, fragment", [
    (["model.d_model=100", "model.n_heads=3"], "not divisible by model.n_heads"),
    (["model.n_heads=4", "model.n_kv_heads=3"], "not divisible by model.n_kv_heads"),
    (["model.d_model=96", "model.n_heads=32"], "even whole number"),            # head_dim 3: odd rotary dims
    (["model.pos.rope.rotary_fraction=0.3"], "even whole number"),
    (["model.pos.kind=learned", "model.pos.max_len=64", "train.seq_len=128"], "max_len=64 is shorter"),
    (["model.pos.kind=sinusoidal", "model.d_model=129", "model.n_heads=3"], "even d_model"),
    (["model.pos.kind=t5", "model.pos.t5.num_buckets=1"], "num_buckets must be at least 2"),
    (["model.pos.kind=t5", "model.pos.t5.max_distance=16"], "max_distance=16 is smaller than"),
    (["model.pos.rope.frequency_fraction=0"], r"frequency_fraction must be in \(0, 1\]"),
    (["model.pos.rope.frequency_fraction=1.01"], r"frequency_fraction must be in \(0, 1\]"),
    (["model.pos.kind=xpos", "model.pos.rope.frequency_fraction=0.05"], "keeps none"),
    (["model.pos.kind=fire", "model.pos.fire.threshold=0"], "must be positive"),
    (["model.pos.kind=xpos", "model.pos.xpos.gamma=-1"], "must be positive"),
    (["train.random_positions.max_len=64"], "random_positions.max_len=64 is smaller than train.seq_len=128"),
    (["train.random_positions.max_len=0"], "random_positions.max_len must be a positive"),
    (["model.pos.kind=learned", "model.pos.max_len=256", "train.random_positions.max_len=512"],
     "max_len=256 is smaller than train.random_positions.max_len=512"),
    (["model.pos.kind=none", "train.random_positions.max_len=512"], "no effect with model.pos.kind=none"),
    (["model.pos.kind=xpos", "train.random_positions.max_len=40000"], "exceeds the 36261 positions"),
    (["model.pos.kind=t5", "train.pos_lr_multiplier=0"], "pos_lr_multiplier must be positive"),
    (["model.pos.kind=t5", "train.pos_lr_multiplier=-2"], "pos_lr_multiplier must be positive"),
    (["model.pos.kind=rope", "train.pos_lr_multiplier=10"], "model.pos.kind=rope has no learned parameters"),
    (["model.pos.kind=alibi", "train.pos_lr_multiplier=10"], "dape, fire, fox, kerple, learned, t5"),
    (["train.max_tokens=1000"], "exactly one of train.max_steps"),
    (["train.max_steps=null"], "exactly one of train.max_steps"),
    (["train.seq_len=0"], "train.seq_len must be a positive"),
    (["train.beta2=1.0"], "train.beta2"),
    (["data.tokenizer.vocab_size=100"], "too small"),
    (["data.source=local"], "data.local.train"),
    (["data.source=local", "data.local.train=[x.txt]"], "validation split"),
    (["data.local.valid_fraction=0.6", "data.local.test_fraction=0.5"], "must be below 1"),
    (["eval.protocols=[]"], "eval.protocols"),
    (["name=a/b"], "name"),
])
def test_impossible_values_rejected(overrides, fragment):
    with pytest.raises(ConfigError, match=fragment) as e:
        load_config(CONFIG_DIR / "quickstart.yaml", overrides)
    assert "quickstart.yaml" in str(e.value)  # the message says which config


def test_learned_max_len_null_means_train_length():
    cfg = load_config([CONFIG_DIR / "quickstart.yaml", CONFIG_DIR / "pe" / "learned.yaml"],
                      ["train.seq_len=96"])
    assert cfg.model.pos.kind == "learned" and cfg.model.pos.max_len == 96


def test_token_budget_by_max_tokens():
    cfg = load_config(CONFIG_DIR / "quickstart.yaml", ["train.max_steps=null", "train.max_tokens=10000"])
    per_step = cfg.train.batch_size * cfg.train.seq_len
    assert cfg.train.total_steps() == -(-10000 // per_step)
    assert cfg.train.total_steps(world_size=2) == -(-10000 // (2 * per_step))


# ------------------------------------------------------------------ round trips and presets

def test_save_load_round_trip(tmp_path):
    cfg = load_config(CONFIG_DIR / "wikitext2-cpu.yaml", [
        "model.pos.kind=learned", "model.pos.max_len=512", "eval.lengths=[64,128]",
        "train.lr=3e-4", "model.norm_eps=1e-6", "data.hub.name=org/corpus:cfg"]).with_vocab_size(8000)
    save_config(cfg, tmp_path / "config.yaml")
    again = load_config(tmp_path / "config.yaml")
    assert again == cfg
    assert config_from_dict(config_to_dict(cfg)) == cfg
    assert again.model.vocab_size == 8000


def test_hub_presets_fill_split_names():
    cfg = load_config(CONFIG_DIR / "quickstart.yaml", ["data.source=hub", "data.hub.name=tinystories"])
    assert cfg.data.hub.repo_and_config == ("roneneldan/TinyStories", None)
    assert (cfg.data.hub.valid_split, cfg.data.hub.test_split) == ("validation", None)
    cfg = load_config(CONFIG_DIR / "quickstart.yaml", ["data.source=hub", "data.hub.name=me/c:x",
                                                       "data.hub.text_field=body"])
    assert cfg.data.hub.repo_and_config == ("me/c", "x") and cfg.data.hub.text_field == "body"


def test_there_are_presets_of_each_kind():
    names = {p.relative_to(CONFIG_DIR).as_posix() for p in PRESETS}
    assert {"base.yaml", "quickstart.yaml", "wikitext2-cpu.yaml", "wikitext2-cpu-local.yaml",
            "gpu/wikitext103-alibi-paper.yaml"} <= names
    assert {f"pe/{k}.yaml" for k in ("rope", "sinusoidal", "learned", "alibi", "nope", "t5", "kerple",
                                     "fire", "xpos", "p-rope", "cope")} <= names


@pytest.mark.parametrize("path", PRESETS, ids=lambda p: p.relative_to(CONFIG_DIR).as_posix())
def test_every_preset_loads(path, tmp_path):
    cfg = load_config(path)
    assert isinstance(cfg, RunConfig)
    save_config(cfg, tmp_path / "c.yaml")
    assert load_config(tmp_path / "c.yaml") == cfg


@pytest.mark.parametrize("overlay", sorted((CONFIG_DIR / "pe").glob("*.yaml")), ids=lambda p: p.stem)
@pytest.mark.parametrize("preset", ["quickstart.yaml", "wikitext2-cpu.yaml",
                                    "gpu/wikitext103-alibi-paper.yaml"])
def test_pe_overlays_compose_with_presets(preset, overlay):
    cfg = load_config([CONFIG_DIR / preset, overlay])
    kind = yaml.safe_load(overlay.read_text())["model"]["pos"]["kind"]
    assert cfg.model.pos.kind == kind
    assert dataclasses.replace(cfg.model) == cfg.model  # revalidates cleanly


def test_pe_overlays_only_touch_the_models_positions_and_layers():
    for overlay in (CONFIG_DIR / "pe").glob("*.yaml"):
        data = yaml.safe_load(overlay.read_text())
        assert list(data) == ["model"] and set(data["model"]) <= {"pos", "layers"}, overlay.name


def test_local_preset_points_at_shared_wikitext():
    cfg = load_config(CONFIG_DIR / "wikitext2-cpu-local.yaml")
    hub = load_config(CONFIG_DIR / "wikitext2-cpu.yaml")
    assert hub.data.source == "hub" and hub.data.hub.name == "wikitext-2-raw-v1"
    assert cfg.data.source == "local"
    assert cfg.data.local.train == ["../shared/data/wikitext-2/train.txt"]
    assert cfg.model == hub.model and cfg.train == hub.train


def test_invalid_yaml_and_non_mapping(tmp_path):
    with pytest.raises(ConfigError, match="invalid YAML"):
        load_config(write(tmp_path / "bad.yaml", "model: [1, 2"))
    with pytest.raises(ConfigError, match="mapping"):
        load_config(write(tmp_path / "list.yaml", "- 1\n- 2\n"))
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "missing.yaml")
