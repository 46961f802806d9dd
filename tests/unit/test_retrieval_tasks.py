"""Retrieval after RULER (Hsieh et al. 2024): passkey's distractors, several needles (multikey,
multivalue), variable tracking, their wording in a text tokenizer, and their bad settings."""

from __future__ import annotations

import re

import numpy as np
import pytest

from ropelab.common.errors import ConfigError
from ropelab.configs.loader import load_config
from ropelab.configs.schema import TokenizerConfig
from ropelab.configs.tasks import SyntheticConfig
from ropelab.data.tasks import TaskError, build_task
from ropelab.data.tasks.haystack import FILLER as FILLER_TEXT
from ropelab.data.tasks.passkey import WORDINGS
from ropelab.data.tasks.vartrack import Vartrack
from ropelab.data.tokenizers import ByteTokenizer, train_tokenizer

from helpers import ROOT
from helpers.tasks import TOK, answer_of, task, text_of


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
