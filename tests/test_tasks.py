"""Synthetic tasks: formats checked by hand, exact lengths, seeded streams, answer-only batches."""

from __future__ import annotations

import hashlib
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from common.errors import ConfigError
from configs.tasks import TASK_NAMES, SyntheticConfig
from data.tasks import ALPHABET, TASKS, TaskData, TaskError, build_task, check_task_name, collate, eval_instance
from data.tasks.batches import TaskSampler, draw
from data.tasks.haystack import FILLER as FILLER_TEXT
from data.tasks.passkey import WORDINGS
from data.tasks.vartrack import Vartrack
from data.tokenizers import ByteTokenizer, CharTokenizer, train_tokenizer
from configs.loader import load_config
from configs.schema import TokenizerConfig
from model.loss import IGNORE_INDEX

ROOT = Path(__file__).resolve().parents[1]
TOK = TaskData(SyntheticConfig()).tokenizer


def task(name: str, **cfg):
    return build_task(name, SyntheticConfig(**cfg), TOK)


def text_of(tokens) -> str:
    return TOK.decode(np.asarray(tokens).tolist())


def answer_of(inst) -> str:
    return text_of(inst.tokens[inst.answer])


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
    code = ("import sys; sys.path.insert(0, 'tests'); import test_tasks; "
            "print(test_tasks._digest_in_this_process())")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         env={"PYTHONHASHSEED": "123", "PATH": ""}, check=True).stdout.strip()
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


# --- retrieval after RULER: distractors, several needles, variable tracking --------------------

NEEDLE = r"([a-z]{2}): (\d{5})\. "  # names of 2 letters, numbers of 5 digits (the defaults)
ASSIGNMENT = r"([a-z]{2}) = ([a-z]{2}|\d{5})\. "


def laid_out(text: str, pattern: str) -> tuple[list[tuple[int, tuple]], str]:
    """(offset in the filler and groups of each piece matching ``pattern``, the filler alone),
    for a prompt whose question is cut off."""
    pieces, filler, end = [], [], 0
    for m in re.finditer(pattern, text):
        filler.append(text[end:m.start()])
        pieces.append((len("".join(filler)), m.groups()))
        end = m.end()
    return pieces, "".join(filler) + text[end:]


def test_passkey_distractors_are_present_and_never_the_key():
    t = task("passkey", distractors=3)
    rng = np.random.default_rng(0)
    for length, depth in ((t.min_length(), 0.5), (80, 0.0), (200, 1.0), (333, 0.4)):
        inst = t.make(rng, length, depth)
        text, key = text_of(inst.tokens), answer_of(inst)
        assert inst.length == length and text.endswith(f"key: {key}")
        body = text[:-len(f"key: {key}")]
        assert body.count(f"key: {key}. ") == 1 and body.count("key:") == 1
        numbers = re.findall(r"\d+", body.replace(f"key: {key}. ", ""))
        assert len(numbers) == 3 and len(set(numbers)) == 3
        assert key not in numbers and all(len(n) == 5 and n[0] != "0" for n in numbers)
        assert all(f"{n}. " in body for n in numbers)
        # Without the pieces, the filler is the paper's two prefixes, split at the key's depth.
        before, after = re.sub(r"\d{5}\. ", "", body).split("key: ")
        filler = WORDINGS["symbolic"].filler * 4
        assert filler.startswith(before) and filler.startswith(after)
        assert len(before) == int(np.floor(depth * (len(before) + len(after)) + 0.5))
    assert task("passkey").min_length() + 3 * 7 == t.min_length()  # three more "NNNNN. "


def test_multikey_asks_one_of_several_distinct_needles_at_its_depth():
    t = task("multikey", needles=4)
    rng = np.random.default_rng(1)
    for length, depth in ((t.min_length(), 0.0), (120, 0.25), (400, 1.0)):
        inst = t.make(rng, length, depth)
        text, value = text_of(inst.tokens), answer_of(inst)
        question = text[:-len(value)]
        asked = re.search(r"([a-z]{2}): $", question).group(1)
        pieces, filler = laid_out(question[:-len(f"{asked}: ")], NEEDLE)
        names, values = [g[0] for _, g in pieces], [g[1] for _, g in pieces]
        assert inst.length == length and len(pieces) == 4
        assert len(set(names)) == 4 and len(set(values)) == 4 and all(len(n) == 2 for n in names)
        assert dict(g for _, g in pieces)[asked] == value  # the asked name's needle holds the answer
        offset = next(o for o, g in pieces if g[0] == asked)
        assert offset == int(np.floor(depth * len(filler) + 0.5))
        assert (FILLER_TEXT * 8).startswith(filler)  # one filler stream, cut where the needles go


def test_multikey_with_several_asked_scores_each_asked_needle_once():
    """RULER's multi-query: the questions follow each other, each answered from its own needle."""
    t = task("multikey", needles=4, asked=3)
    assert t.min_length() == task("multikey", needles=4).min_length() + 2 * len(". ab: 12345")
    for seed, depth in ((0, 0.0), (1, 0.5), (2, 1.0)):
        inst = t.make(np.random.default_rng(seed), 150, depth)
        text = text_of(inst.tokens)
        spans = [m.span() for m in re.finditer(r"1+", "".join("1" if a else "0" for a in inst.answer))]
        values = [text[a:b] for a, b in spans]
        tail = text[spans[0][0] - len("ab: "):]
        asked = re.findall(r"([a-z]{2}): \d{5}", tail)
        assert len(spans) == 3 and tail == ". ".join(f"{n}: {v}" for n, v in zip(asked, values))
        pieces, filler = laid_out(text[:spans[0][0] - len("ab: ")], NEEDLE)
        held = dict(g for _, g in pieces)
        assert len(pieces) == 4 and len(set(asked)) == 3 and all(held[n] == v for n, v in zip(asked, values))
        first = next(o for o, g in pieces if g[0] == asked[0])  # the first asked needle sits at the depth
        assert first == int(np.floor(depth * len(filler) + 0.5))
    one = task("multikey", needles=4)  # one asked: the instances made before `asked` existed, draw for draw
    assert text_of(one.make(np.random.default_rng(5), 120, 0.3).tokens) == (
        "theru: 98157.  grassav: 14853.  is green. mn: 35013. the sky qh: 44503. is blue. the sun is yellow. "
        "here we go. mn: 35013")
    with pytest.raises(ConfigError, match="data.synthetic.asked must be in \\[1, needles=4\\]"):
        SyntheticConfig(tasks=["multikey"], needles=4, asked=5)


@pytest.mark.parametrize("name, total", [("multikey", 4), ("vartrack", 3)])
def test_mixed_asks_one_to_all_and_reaches_where_one_question_puts_its_needle(name, total):
    """Every needle asked leaves (total - 1) questions' tokens less room at L, so training that
    always asks all never lays a piece where a one-question instance of L does; mixed asks a
    uniform 1 to all and covers both layouts, each instance still exactly L long."""
    size = {"needles": total} if name == "multikey" else {"chains": total, "hops": 1}
    mixed, every, one = (task(name, asked=a, **size) for a in ("mixed", "all", 1))
    assert mixed.min_length() == every.min_length() > one.min_length()  # room for the most questions
    length, rng = 128, np.random.default_rng(0)

    def draws(t, n=300):
        out = []
        for _ in range(n):
            inst = t.make(rng, length)
            assert inst.length == length
            spans = re.findall(r"1+", "".join("1" if a else "0" for a in inst.answer))
            before = text_of(inst.tokens)[:inst.answer.nonzero()[0][0]]
            last_piece = max(m.end() for m in re.finditer(r"\d{5}\. |[a-z]{2} = [a-z]{2}\. ", before))
            out.append((len(spans), last_piece))
        return out

    counts = [c for c, _ in draws(mixed)]
    assert set(counts) == set(range(1, total + 1))  # every count of questions, 1 to all
    assert min(counts.count(k) for k in range(1, total + 1)) > 300 / total / 2  # roughly uniform
    reach = {label: max(p for _, p in draws(t)) for label, t in (("mixed", mixed), ("all", every), ("one", one))}
    assert reach["all"] < reach["one"] - (total - 1) * 8  # all-asked never lays a piece that late
    assert reach["mixed"] >= reach["one"] - 4  # mixed does
    with pytest.raises(ConfigError, match="got -1\\); all asks every one, mixed 1 to all of them"):
        SyntheticConfig(tasks=[name], asked=-1)


def test_multivalue_answers_every_value_in_the_order_of_the_text():
    t = task("multivalue", values=3)
    for seed in range(5):
        inst = t.make(np.random.default_rng(seed), 150)
        text, answer = text_of(inst.tokens), answer_of(inst)
        asked = re.search(r"([a-z]{2}): $", text[:-len(answer)]).group(1)
        pieces, _ = laid_out(text[:-len(answer) - len(f"{asked}: ")], NEEDLE)
        assert {name for _, (name, _) in pieces} == {asked} and len(pieces) == 3  # one name, three values
        assert answer == " ".join(v for _, (_, v) in pieces) and len(set(answer.split())) == 3


@pytest.mark.parametrize("name", ["multikey", "multivalue", "vartrack"])
def test_unspaced_wording_puts_the_name_right_before_the_separator_its_answer_follows(name):
    """data.synthetic.spaced=false: "wq:37704", "y=x" and the question "wq:", so the token
    before the answer's first is the separator and the one before that the name's last letter;
    the default keeps the spaced wording (and its draws)."""
    spaced, unspaced = task(name), task(name, spaced=False)
    pieces = {"multikey": 4, "multivalue": 4, "vartrack": 2 * 3}[name]  # needles, values, assignments
    assert unspaced.min_length() == spaced.min_length() - pieces * (2 if name == "vartrack" else 1) - 1
    assert "unspaced" in unspaced.describe() and "unspaced" not in spaced.describe()
    for seed in range(4):
        inst = unspaced.make(np.random.default_rng(seed), 128, 0.5 if name == "multikey" else None)
        first = int(inst.answer.nonzero()[0][0])
        text, prompt = text_of(inst.tokens), text_of(inst.tokens[:first])
        assert ": " not in text and " = " not in text and prompt.endswith(":")
        asked = re.search(r"([a-z]{2}):$", prompt).group(1)
        body = prompt[:-len(asked) - 1]
        if name == "vartrack":
            assigned = dict(re.findall(r"([a-z]{2})=([a-z]{2}|\d{5})\. ", body))
            value = asked
            while not value.isdigit():
                value = assigned[value]
            assert len(assigned) == 6 and answer_of(inst) == value
        else:
            needles = re.findall(r"([a-z]{2}):(\d{5})\. ", body)
            assert len(needles) == 4
            if name == "multikey":
                assert dict(needles)[asked] == answer_of(inst) and len({n for n, _ in needles}) == 4
            else:
                assert {n for n, _ in needles} == {asked} and answer_of(inst) == " ".join(v for _, v in needles)
    cfg = load_config(ROOT / "configs/synthetic-cpu.yaml", [f"data.synthetic.tasks=[{name}]", "data.synthetic.spaced=false"])
    assert build_task(name, cfg.data.synthetic, TOK).spaced is False


def resolve(text: str, variable: str) -> str:
    """Follow ``variable``'s assignments in ``text`` back to a number (each variable assigned once)."""
    assigned = dict(re.findall(ASSIGNMENT, text))
    assert len(assigned) == len(re.findall(r" = ", text))  # no variable assigned twice
    while not variable.isdigit():
        variable = assigned[variable]
    return variable


def test_variable_tracking_chains_resolve_to_the_asked_value():
    t = task("vartrack", chains=3, hops=2)
    rng = np.random.default_rng(2)
    for length in (t.min_length(), 150, 500):
        inst = t.make(rng, length)
        text, value = text_of(inst.tokens), answer_of(inst)
        asked = re.search(r"([a-z]{2}): $", text[:-len(value)]).group(1)
        body = text[:-len(value) - len(asked) - 2]
        assert inst.length == length and resolve(body, asked) == value
        pairs = re.findall(ASSIGNMENT, body)
        assert len(pairs) == 9 and len({v for _, v in pairs if v.isdigit()}) == 3  # 3 chains, distinct values
        position = {name: i for i, (name, _) in enumerate(pairs)}
        assert all(position[source] < position[name] for name, source in pairs if not source.isdigit())
        hops, v = 0, asked  # the asked variable is a chain's last: 2 assignments back to its value
        while not v.isdigit():
            v, hops = dict(pairs)[v], hops + 1
        assert hops == 3


def test_variable_tracking_with_several_asked_resolves_each_question():
    t = task("vartrack", chains=3, hops=1, asked=3)
    for seed in range(4):
        inst = t.make(np.random.default_rng(seed), 160)
        text = text_of(inst.tokens)
        spans = [m.span() for m in re.finditer(r"1+", "".join("1" if a else "0" for a in inst.answer))]
        start = spans[0][0] - len("ab: ")
        body, values = text[:start], [text[a:b] for a, b in spans]
        asked = re.findall(r"([a-z]{2}): \d{5}", text[start:])
        assert len(set(asked)) == 3 and [resolve(body, v) for v in asked] == values
    with pytest.raises(TaskError, match="data.synthetic.asked=3 must be in \\[1, chains=2\\]"):
        Vartrack(TOK, chains=2, asked=3)
    with pytest.raises(ConfigError, match="must be in \\[1, chains=2\\] for vartrack"):
        SyntheticConfig(tasks=["vartrack"], chains=2, asked=3)
    every = SyntheticConfig(tasks=["multikey", "vartrack"], needles=4, chains=2, asked="all")  # each its own count
    assert [build_task(n, every, TOK).asked for n in ("multikey", "vartrack")] == [4, 2]


@pytest.mark.parametrize("name", ["passkey", "multikey", "multivalue", "vartrack"])
def test_retrieval_tasks_in_a_text_tokenizer_fill_the_length_exactly(name, corpus):
    """The mix's wording written with a text run's BPE: every instance is exactly the asked length
    and min_length bounds every draw; the answer's tokens are the needle's (tokenized apart)."""
    texts = (corpus / "train.txt").read_text().splitlines()
    tok = train_tokenizer(TokenizerConfig(kind="bpe", vocab_size=400), texts)
    t = build_task(name, SyntheticConfig(distractors=2), tok)
    rng = np.random.default_rng(0)
    for length in (t.min_length(), t.min_length() + 5, 300):
        inst = t.make(rng, length, 0.5)
        assert inst.length == length
        answer = inst.tokens[inst.answer].tolist()
        body = inst.tokens[:np.flatnonzero(inst.answer)[0]].tolist()
        first = answer[:len(tok.encode(tok.decode(answer).split(" ")[0]))]
        assert any(body[i:i + len(first)] == first for i in range(len(body)))


def test_bad_retrieval_settings_are_clear():
    with pytest.raises(ConfigError, match="name_letters=1 gives 26 names, too few for 18"):
        SyntheticConfig(name_letters=1, chains=6, hops=2)
    with pytest.raises(ConfigError, match="key_digits=1 gives 9 numbers, too few for 8"):
        SyntheticConfig(key_digits=1, distractors=7)
    with pytest.raises(TaskError, match="passkey distractors .* the paper's prompt"):
        build_task("passkey", SyntheticConfig(distractors=2), ByteTokenizer(), text=True)
    with pytest.raises(TaskError, match="train with data.mix.tasks=\\[multikey\\]"):
        build_task("multikey", SyntheticConfig(), ByteTokenizer(), text=True)
    with pytest.raises(TaskError, match="multikey with 4 needles needs at least 52 positions"):
        task("multikey").check_length(40)
    with pytest.raises(TaskError, match="depth must be in"):
        task("multikey").make(np.random.default_rng(0), 80, -0.1)
