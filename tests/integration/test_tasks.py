"""Synthetic tasks: formats checked by hand, exact lengths, seeded streams, answer-only batches."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from ropelab.configs.tasks import TASK_NAMES, SyntheticConfig
from ropelab.data.tasks import ALPHABET, TASKS, TaskData, TaskError, build_task, check_task_name, collate, eval_instance
from ropelab.data.tasks.batches import TaskSampler, draw
from ropelab.data.tasks.passkey import WORDINGS
from ropelab.data.tokenizers import ByteTokenizer, CharTokenizer, train_tokenizer
from ropelab.configs.schema import TokenizerConfig
from ropelab.model.loss import IGNORE_INDEX

from helpers.tasks import TOK, answer_of, task, text_of
from helpers import ROOT


def test_registry_is_the_config_list_and_the_alphabet_is_one_char_per_token():
    assert tuple(TASKS) == TASK_NAMES
    assert TOK.vocab_size == len(ALPHABET) + 1 and len(set(ALPHABET)) == len(ALPHABET)
    assert TOK.encode(ALPHABET) == [TOK.index[c] for c in ALPHABET]


@pytest.mark.parametrize("name", TASK_NAMES)
def test_lengths_are_exact_where_the_format_allows_and_never_over(name):
    t = task(name)
    rng = np.random.default_rng(0)
    for length in range(t.min_length(), 90):
        inst = t.make(rng, length, 0.5)
        exact = {"copy": length % 2 == 0, "addition": (length + 1) % 4 == 0}.get(name, True)
        assert inst.length == length if exact else length - 3 <= inst.length < length
        assert inst.answer.any() and not inst.answer[0]
        assert set(text_of(inst.tokens)) <= set(ALPHABET)


def test_passkey_format_by_hand():
    t = task("passkey")
    rng = np.random.default_rng(1)
    for depth in (0.0, 0.37, 1.0):
        inst = t.make(rng, 80, depth)
        text, key = text_of(inst.tokens), answer_of(inst)
        assert len(key) == 5 and key[0] != "0" and key.isdigit()
        filler = WORDINGS["symbolic"].filler * 3
        before, rest = text.split(f"key: {key}. ")
        after = rest[:-len(f"key: {key}")]
        assert rest.endswith(f"key: {key}") and filler.startswith(before) and filler.startswith(after)
        room = len(before) + len(after)
        assert len(before) == int(np.floor(depth * room + 0.5))
    assert text_of(t.make(rng, 21, 0.0).tokens).startswith("key: ")  # the shortest: no filler at all


def test_copy_format_by_hand():
    inst = task("copy").make(np.random.default_rng(0), 30)
    s, copied = text_of(inst.tokens).split(">")
    assert s == copied == answer_of(inst) and len(s) == 15 and s.isalpha()


def test_recall_answers_are_the_values_of_the_queried_keys():
    t = task("recall", pairs=6, queries=4)
    inst = t.make(np.random.default_rng(3), 60)
    text = text_of(inst.tokens)
    pairs = dict(zip(text[0:12:2], text[1:12:2]))
    assert len(pairs) == 6 and all(k.isalpha() and v.isdigit() for k, v in pairs.items())
    where = np.flatnonzero(inst.answer)
    assert len(where) == 4 and all(i >= 12 for i in where)
    assert len({text[i - 1] for i in where}) == 4  # distinct keys asked
    for i in where:
        assert text[i] == pairs[text[i - 1]]
    assert set(np.delete(np.array(list(text[12:])), np.r_[where, where - 1] - 12)) == {"."}


@pytest.mark.parametrize("layout", ["aligned", "sequential"])
def test_addition_is_correct_arithmetic_least_significant_digit_first(layout):
    t = task("addition", addition_layout=layout)
    rng = np.random.default_rng(0)
    for length in (t.min_length(), 11, 44, 63):
        inst = t.make(rng, length)
        text = text_of(inst.tokens)
        if layout == "sequential":
            a, rest = text.split("+")
            b, c = rest.split("=")
            assert c == answer_of(inst) and len(a) == len(b) == len(c) - 1 == (length - 2) // 3
        else:
            groups = [text[i:i + 4] for i in range(0, len(text), 4)]
            assert all(len(g) == 4 and g[2] == "=" for g in groups) and groups[-1][:2] == "00"
            a, b, c = ("".join(g[k] for g in groups) for k in (0, 1, 3))
            assert c == answer_of(inst) and len(groups) == (length + 1) // 4
            assert inst.answer.tolist() == [i % 4 == 3 for i in range(len(text))]
        assert int(a[::-1]) + int(b[::-1]) == int(c[::-1])


def test_impossible_parameters_and_unknown_names_are_clear():
    with pytest.raises(TaskError, match="recall with 8 pairs and 8 queries needs at least 31 positions"):
        task("recall").check_length(30)
    with pytest.raises(TaskError, match="did you mean 'passkey'"):
        check_task_name("paskey")
    with pytest.raises(TaskError, match="depth must be in"):
        task("passkey").make(np.random.default_rng(0), 40, 1.5)
    with pytest.raises(TaskError, match="text runs can be scored on passkey only"):
        build_task("copy", SyntheticConfig(), ByteTokenizer(), text=True)
    with pytest.raises(TaskError, match="cannot write the passkey prompt"):
        build_task("passkey", SyntheticConfig(), CharTokenizer("abc .\n"), text=True)
    with pytest.raises(TaskError, match="train.seq_len is 16"):
        TaskData(SyntheticConfig(tasks=["recall"])).train_sampler(16, 4, 0)


@pytest.mark.parametrize("tokenizer", ["byte", "bpe"])
def test_text_passkey_tokenizes_like_the_whole_prompt_and_fits_exactly(tokenizer, corpus):
    """The paper's wording in a text run's tokenizer: concatenated pieces equal encoding
    the decoded prompt at once, every instance has exactly the asked length, and
    min_length bounds every key's token count."""
    if tokenizer == "byte":
        tok = ByteTokenizer()
    else:
        texts = (corpus / "train.txt").read_text().splitlines() + [WORDINGS["text"].intro]
        tok = train_tokenizer(TokenizerConfig(kind="bpe", vocab_size=400), texts)
    t = build_task("passkey", SyntheticConfig(), tok, text=True)
    rng = np.random.default_rng(0)
    for length in (t.min_length(), t.min_length() + 7, 300):
        for depth in (0.0, 0.5, 1.0):
            inst = t.make(rng, length, depth)
            prompt = tok.decode(inst.tokens.tolist())
            assert inst.length == length
            assert tok.encode(prompt) == inst.tokens.tolist()
            assert prompt.startswith("There is an important info") and "\nThe pass key is " in prompt
            assert prompt.endswith(f"What is the pass key? The pass key is {tok.decode(inst.tokens[inst.answer].tolist())[1:]}")


def test_collate_scores_answers_only_and_pads_after():
    t = task("passkey")
    insts = [t.make(np.random.default_rng(i), n, 0.5) for i, n in enumerate((30, 47))]
    x, y = collate(insts, 48, pad_id=TOK.eot_id)
    assert x.shape == y.shape == (2, 48) and x.dtype == y.dtype == torch.int64
    for row, inst in enumerate(insts):
        n = inst.length
        assert x[row, :n].tolist() == inst.tokens[:-1].tolist() and (x[row, n:] == TOK.eot_id).all()
        scored = (y[row] != IGNORE_INDEX).nonzero().flatten().tolist()
        assert scored == [i - 1 for i in np.flatnonzero(inst.answer)]
        assert y[row, scored].tolist() == inst.tokens[inst.answer].tolist()


def test_batches_are_a_pure_function_of_seed_and_index_and_split_across_ranks():
    data = TaskData(SyntheticConfig(tasks=["recall"], pairs=4))
    one = data.train_sampler(32, 8, seed=5)
    batches = [one.next_batch() for _ in range(3)]
    again = data.train_sampler(32, 8, seed=5)
    again.load_state_dict({"seed": 5, "batches_drawn": 2})
    assert torch.equal(again.next_batch()[0], batches[2][0])
    ranks = [data.train_sampler(32, 4, seed=5, rank=r, world_size=2) for r in (0, 1)]
    for k in range(3):
        x = torch.cat([r.next_batch()[0] for r in ranks])
        assert torch.equal(x, batches[k][0])
    other = data.train_sampler(32, 8, seed=6).next_batch()
    assert not torch.equal(other[0], batches[0][0])
    # Lengths cover the whole training range (uniform from the shortest up to seq_len).
    lengths = {draw(data.tasks, (0, 5, 0, j), 32).length for j in range(400)}
    assert min(lengths) == data.tasks[0].min_length() and max(lengths) == 32


def test_validation_and_test_sets_do_not_depend_on_the_training_seed():
    data = TaskData(SyntheticConfig(tasks=["copy"]))
    (task,) = data.tasks
    a, b = data.validation_batches(16, 4, 2), data.validation_batches(16, 4, 2)
    assert all(torch.equal(x1, x2) for (x1, _), (x2, _) in zip(a, b))
    train_x = data.train_sampler(16, 4, seed=0).next_batch()[0]
    assert not torch.equal(a[0][0], train_x)
    i1, i2 = eval_instance(task, 0, 40, None, 3), eval_instance(task, 0, 40, None, 3)
    assert np.array_equal(i1.tokens, i2.tokens)
    assert not np.array_equal(i1.tokens, eval_instance(task, 1, 40, None, 3).tokens)


def _digest_in_this_process() -> str:
    data = TaskData(SyntheticConfig(tasks=["passkey", "copy", "recall", "addition"]))
    x, y = data.train_sampler(64, 16, seed=3).next_batch()
    inst = eval_instance(data.tasks[0], 0, 200, 0.25, 7)
    return hashlib.sha256(x.numpy().tobytes() + y.numpy().tobytes() + inst.tokens.tobytes()).hexdigest()


def test_same_instances_in_another_process():
    code = ("import sys; sys.path[:0] = sys.argv[1:]; import test_tasks; "  # this file, and the helpers it imports
            "print(test_tasks._digest_in_this_process())")
    out = subprocess.run([sys.executable, "-c", code, str(Path(__file__).parent), str(ROOT / "tests")], cwd=ROOT,
                         capture_output=True, text=True, env={"PYTHONHASHSEED": "123", "PATH": ""},
                         check=True).stdout.strip()
    assert out == _digest_in_this_process()


def test_sampler_refuses_a_training_length_the_task_cannot_fill():
    with pytest.raises(TaskError, match="passkey"):
        TaskSampler([task("copy"), task("passkey")], 10, 4, seed=0, pad_id=0)


def test_several_tasks_are_drawn_uniformly_per_instance():
    data = TaskData(SyntheticConfig(tasks=["passkey", "copy", "recall", "addition"]))
    kinds = []
    for j in range(400):
        text = text_of(draw(data.tasks, (0, 1, 0, j), 64).tokens)
        kinds.append("passkey" if "key:" in text else "copy" if ">" in text else "addition" if "=" in text
                     else "recall")
    counts = {k: kinds.count(k) for k in ("passkey", "copy", "recall", "addition")}
    assert all(70 <= c <= 130 for c in counts.values()), counts  # 100 expected each
    with pytest.raises(Exception, match="distinct tasks"):
        SyntheticConfig(tasks=["copy", "copy"])
