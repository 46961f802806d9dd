"""Importing a Llama that transformers saved itself (scripts/export_hf.py --import): its own
tokenizer, EOS and YaRN scaling carried over, logits within tolerance of ``LlamaForCausalLM``,
and evaluation that tokenizes with the run's foreign tokenizer."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from ropelab.configs.schema import LocalConfig
from ropelab.data.tokenizers import load_tokenizer
from ropelab.scripts.export_hf import main as cli
from ropelab.training.saved_run import load_run

from helpers.hf import TEXTS, TOL, TRAIN_LEN, max_diff

pytest.importorskip("transformers")


def _foreign_llama(tmp_path):
    """A Llama saved by transformers with a word-level BPE and </s> as its EOS: (dir, model, tokenizer)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM

    fast = Tokenizer(models.BPE(unk_token="<unk>"))
    fast.pre_tokenizer = pre_tokenizers.Whitespace()
    fast.train_from_iterator(TEXTS * 20, trainers.BpeTrainer(vocab_size=120, special_tokens=["<unk>", "<s>", "</s>"]))
    # rope_theta/rope_scaling: the layout every transformers version from 4.45 reads.
    cfg = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=4 * TRAIN_LEN, tie_word_embeddings=False,
                      bos_token_id=1, eos_token_id=2, rms_norm_eps=1e-6, rope_theta=5000.0,
                      rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": TRAIN_LEN})
    torch.manual_seed(0)
    hf_model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        for p in hf_model.parameters():
            p.normal_(0, 0.06) if p.dim() > 1 else p.uniform_(0.5, 1.5)
    hf_dir = tmp_path / "foreign"
    hf_model.save_pretrained(str(hf_dir))
    fast.save(str(hf_dir / "tokenizer.json"))
    (hf_dir / "tokenizer_config.json").write_text(json.dumps({"eos_token": "</s>", "bos_token": "<s>"}))
    return hf_dir, hf_model, fast


def test_foreign_llama_with_its_own_eos_and_yarn(tmp_path):
    hf_dir, hf_model, fast = _foreign_llama(tmp_path)
    assert cli(["--import", str(hf_dir), str(tmp_path / "run")]) == 0
    run = load_run(tmp_path / "run")
    s = run.cfg.model.pos.rope.scaling
    assert (s.type, s.factor, s.original_max_len, run.cfg.model.pos.rope.theta) == ("yarn", 4.0, TRAIN_LEN, 5000.0)
    assert run.cfg.train.seq_len == TRAIN_LEN and not run.cfg.model.tie_embeddings
    assert run.tokenizer.eot_id == 2 and run.tokenizer.encode("the cat") == fast.encode("the cat").ids
    x = torch.randint(0, 128, (1, 4 * TRAIN_LEN))
    assert max_diff(run.model, hf_model, x) < TOL


def test_foreign_import_evaluates_with_its_own_tokenizer(tmp_path, corpus):
    """A foreign tokenizer cannot be retrained: the run says data.tokenizer.kind=file and
    evaluation tokenizes the corpus with the run's tokenizer.json, even after a move."""
    from ropelab.configs import load_config, save_config
    from ropelab.eval.lm.extrapolation import main as extrapolation

    hf_dir, _, fast = _foreign_llama(tmp_path)
    assert cli(["--import", str(hf_dir), str(tmp_path / "run")]) == 0
    cfg = load_config(tmp_path / "run" / "config.yaml")
    assert cfg.data.tokenizer.kind == "file"
    data = dataclasses.replace(cfg.data, source="local", cache_dir=str(tmp_path / "cache"), num_proc=1,
                               local=LocalConfig(train=[str(corpus / "train.txt")],
                                                 valid=[str(corpus / "valid.txt")]))
    save_config(dataclasses.replace(cfg, data=data), tmp_path / "run" / "config.yaml")
    (tmp_path / "run").rename(tmp_path / "moved")
    out = tmp_path / "report"
    assert extrapolation([str(tmp_path / "moved"), "--lengths", "16", "32", "--max-tokens", "256",
                          "--no-per-position", "--out", str(out)]) == 0
    rows = json.loads((out / "results.json").read_text())["results"]
    assert [r["status"] for r in rows] == ["ok", "ok"] and all(r["ppl"] > 1 for r in rows)
    prepared = list((tmp_path / "cache").glob("local-file-*/tokenizer.json"))
    assert len(prepared) == 1 and load_tokenizer(prepared[0]).encode("the cat") == fast.encode("the cat").ids
