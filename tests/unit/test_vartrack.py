"""Variable tracking answered with the chain (data.synthetic.vartrack_answer: chain): the answer
spells the asked variable's chain back to its value, and every hop of it is right."""

from __future__ import annotations

import re

import numpy as np
import pytest

from ropelab.common.errors import ConfigError
from ropelab.configs.loader import load_config
from ropelab.configs.tasks import SyntheticConfig
from ropelab.data.tasks import TaskError, build_task
from ropelab.data.tasks.vartrack import Vartrack

from helpers.tasks import TOK
from helpers import ROOT


def vartrack(**cfg) -> Vartrack:
    return build_task("vartrack", SyntheticConfig(tasks=["vartrack"], **cfg), TOK)


def spans(inst) -> list[str]:
    """The instance's answers, in order (runs of answer tokens)."""
    text = TOK.decode(inst.tokens.tolist())
    runs = re.finditer(r"1+", "".join("1" if a else "0" for a in inst.answer))
    return [text[m.start():m.end()] for m in runs]


def body(inst, question: str = "ab: ") -> str:
    """The text before the first question (``question``: one as long as it)."""
    start = int(np.argmax(inst.answer)) - len(question)
    return TOK.decode(inst.tokens[:start].tolist())


def assignments(text: str, spaced: bool, letters: int = 2) -> dict[str, str]:
    """variable -> what it is assigned (a variable or a number); pieces may fall mid-word, so
    a name is its last ``letters`` letters before the "="."""
    eq = " = " if spaced else "="
    found = re.findall(rf"([a-z]{{{letters}}}){eq}([a-z]{{{letters}}}|\d{{5}})\. ", text)
    assert len(found) == text.count(eq.strip())  # every assignment read, none twice
    return dict(found)


@pytest.mark.parametrize("spaced", [True, False])
@pytest.mark.parametrize("hops", [1, 2, 3])
def test_the_chain_answer_walks_every_hop_back_to_the_value(hops, spaced):
    letters = 1 if hops < 3 else 2
    t = vartrack(chains=3, hops=hops, spaced=spaced, vartrack_answer="chain", name_letters=letters)
    eq, colon = (" = ", ": ") if spaced else ("=", ":")
    rng = np.random.default_rng(hops)
    for length in (t.min_length(), t.min_length() + 40, 300):
        inst = t.make(rng, length)
        assert inst.length == length
        (answer,) = spans(inst)
        text = TOK.decode(inst.tokens.tolist())
        question = text[:len(text) - len(answer)]
        asked = re.search(rf"([a-z]{{{letters}}}){colon}$", question).group(1)
        before = question[:-len(asked) - len(colon)]
        # the answer's every step is the assignment the text makes: asked = n1 = n2 = ... = value
        steps = answer.split(eq)
        assert len(steps) == hops + 1 and steps[-1].isdigit() and len(steps[-1]) == 5
        table = assignments(before, spaced, letters)
        walk = [table[asked]]
        while not walk[-1].isdigit():
            walk.append(table[walk[-1]])
        assert walk == steps


def test_the_value_answer_is_unchanged_and_the_chain_answer_is_the_same_instance_otherwise():
    value, chain = vartrack(chains=2, hops=2), vartrack(chains=2, hops=2, vartrack_answer="chain")
    a, b = value.make(np.random.default_rng(5), 100), chain.make(np.random.default_rng(5), 100)
    (va,), (ca,) = spans(a), spans(b)
    assert ca.endswith(" = " + va) and ca.count(" = ") == 2
    # same chains and values: the texts agree up to the filler the longer answer takes
    assert assignments(body(a), True) == assignments(body(b), True)
    assert chain.min_length() == value.min_length() + 2 * len("ab = ")
    assert "answered with the chain" in chain.describe() and "chain" not in value.describe().split("chains")[-1]


def test_several_asked_each_answered_with_its_chain():
    t = vartrack(chains=3, hops=1, asked="all", vartrack_answer="chain")
    inst = t.make(np.random.default_rng(1), 200)
    answers = spans(inst)
    text = TOK.decode(inst.tokens.tolist())
    table = assignments(body(inst), True)
    asked = re.findall(r"([a-z]{2}): (?=[a-z]{2} = \d)", text)
    assert len(answers) == 3 and len(set(asked)) == 3
    assert [f"{table[q]} = {table[table[q]]}" for q in asked] == answers


def test_chance_and_scoring_as_one_question_keep_the_answer_form():
    cfg = SyntheticConfig(tasks=["vartrack"], chains=4, hops=1, asked="mixed", vartrack_answer="chain")
    scored = build_task("vartrack", cfg.scored_as(1, ["vartrack"]), TOK)
    assert scored.answer == "chain" and scored.asked == 1 and scored.chance == pytest.approx(1 / 4)


def test_a_wrong_answer_form_is_refused_with_the_choices():
    with pytest.raises(ConfigError, match="vartrack_answer must be one of 'value', 'chain'"):
        load_config(ROOT / "configs/synthetic-cpu.yaml", ["data.synthetic.tasks=[vartrack]",
                                                        "data.synthetic.vartrack_answer=names"])
    with pytest.raises(TaskError, match="value or the chain"):
        Vartrack(TOK, answer="names")
    cfg = load_config(ROOT / "configs/synthetic-cpu.yaml", ["data.synthetic.tasks=[vartrack]",
                                                          "data.synthetic.vartrack_answer=chain"])
    assert build_task("vartrack", cfg.data.synthetic, TOK).answer == "chain"


@pytest.mark.parametrize("spaced", [True, False])
def test_asked_in_the_assignments_form_the_question_is_the_texts_name_and_mark(spaced):
    """vartrack_question: equals asks "ba=" (spaced "ba = "): the asked variable written as
    the text assigns it, so the chain answer repeats the text's assignments hop by hop; the
    instance is otherwise the colon question's."""
    eq, colon = (" = ", ": ") if spaced else ("=", ":")
    asks = {q: vartrack(chains=3, hops=2, spaced=spaced, vartrack_answer="chain", name_letters=1,
                        vartrack_question=q) for q in ("colon", "equals")}
    made = {q: t.make(np.random.default_rng(7), 120) for q, t in asks.items()}
    (answer,) = spans(made["equals"])
    assert spans(made["colon"]) == [answer]  # the same chains, the same answer
    text = TOK.decode(made["equals"].tokens.tolist())
    question = text[:len(text) - len(answer)]
    asked = re.search(rf"([a-z]){eq}$", question).group(1)
    table = assignments(question[:-len(asked) - len(eq)], spaced, 1)
    # asked = n1 = n2 = value, each step an assignment of the text, the first one found as written
    steps = [asked, *answer.split(eq)]
    assert all(table[a] == b for a, b in zip(steps, steps[1:])) and f"{asked}{eq}{steps[1]}. " in question
    assert TOK.decode(made["colon"].tokens.tolist()).endswith(f"{asked}{colon}{answer}")
    assert asks["equals"].min_length() == asks["colon"].min_length() + len(eq) - len(colon)
    assert "asked in the assignments' form" in asks["equals"].describe()
    assert "assignments' form" not in asks["colon"].describe()
    with pytest.raises(ConfigError, match="vartrack_question must be one of 'colon', 'equals'"):
        load_config(ROOT / "configs/synthetic-cpu.yaml", ["data.synthetic.tasks=[vartrack]",
                                                        "data.synthetic.vartrack_question=dash"])
    with pytest.raises(TaskError, match="colon or an equals sign"):
        Vartrack(TOK, question="dash")
