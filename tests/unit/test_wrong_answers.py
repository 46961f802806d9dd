"""What the wrong answers were: greedy decoding of a wrong answer span, whether it copies another
of the prompt's candidates, and the report's table of it (eval/tasks/answers.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ropelab.configs.schema import EvalConfig
from helpers.models import ALL_KINDS, tiny_config
from ropelab.data.tasks import TASKS, Instance, eval_instance, task_tokenizer
from ropelab.data.tasks.base import answer_source, answer_spans, last_copy
from ropelab.data.tasks.passkey import Passkey
from ropelab.eval.tasks.exact_match import score_cell
from ropelab.eval.tasks.answers import answers_section, tally
from ropelab.model.generate import generate
from ropelab.model.transformer import Transformer
from helpers.tasks import FixedPredictions as Table  # prediction at position t: table[t]
from ropelab.training.exact_match import first_errors, wrong_answers


def inst(tokens, answer_positions) -> Instance:
    answer = np.zeros(len(tokens), dtype=bool)
    answer[list(answer_positions)] = True
    return Instance(np.asarray(tokens, dtype=np.int64), answer)


@pytest.mark.parametrize("kind", ALL_KINDS)
def test_a_wrong_answer_is_what_greedy_decoding_writes(kind):
    # wrong_answers decodes with the KV cache, instances wrong at the same position together;
    # generate without a cache (a full forward per token) is the reference.
    torch.manual_seed(0)
    model = Transformer(tiny_config(kind)).eval()
    rng = np.random.default_rng(1)
    instances, greedy = [], []
    lengths = (9, 14, 14, 20)
    for n in lengths:
        prompt = rng.integers(0, 97, size=n).tolist()
        written = generate(model, prompt, max_new_tokens=4, temperature=0, use_cache=False)[0, n:].tolist()
        truth = [(written[0] + 1) % 97, *rng.integers(0, 97, size=3).tolist()]  # wrong from its first token
        instances.append(inst(prompt + truth, range(n, n + 4)))
        greedy.append(written)
    right_prompt = rng.integers(0, 97, size=11).tolist()
    right = generate(model, right_prompt, max_new_tokens=4, temperature=0, use_cache=False)[0, 11:].tolist()
    instances.append(inst(right_prompt + right, range(11, 15)))
    errors = first_errors(model, instances)
    assert errors.tolist() == [0, 0, 0, 0, 4]
    got = wrong_answers(model, instances, errors)
    assert got[4] is None
    for (start, tokens), n, want in zip(got[:4], lengths, greedy):
        assert start == n and tokens.tolist() == want


def test_the_span_decoded_is_the_one_the_first_error_falls_in_given_the_true_text_before_it():
    # Answers at 2 (one token) and 5-6; the model predicts the table's token at each position.
    table = [0, 4, 1, 2, 8, 9, 0, 0]
    right_first = inst([0, 1, 4, 3, 3, 8, 5, 0], [2, 5, 6])  # first span right (4), second wrong at its 2nd token
    got = wrong_answers(Table(table), [right_first], first_errors(Table(table), [right_first]))
    assert got[0][0] == 5 and got[0][1].tolist() == [8, 9]
    # Wrong at its first token: the token written there is fed to the next prediction (here the
    # table ignores it), and the span's later tokens are the model's, not the truth's.
    wrong_first = inst([0, 1, 4, 3, 3, 7, 7, 0], [2, 5, 6])
    got = wrong_answers(Table(table), [wrong_first], first_errors(Table(table), [wrong_first]))
    assert got[0][0] == 5 and got[0][1].tolist() == [8, 9]


def test_where_a_wrong_answer_was_copied_from():
    # The key 1 2 at 1-2; other candidates 3 4 at 5-6 and 5 6 at 8-9; the question's answer at 12-13.
    tokens = [0, 1, 2, 0, 0, 3, 4, 0, 5, 6, 0, 9, 1, 2]
    answer = range(12, 14)
    instance = inst(tokens, answer)
    assert last_copy(instance, 12, np.array([1, 2])) == 1
    assert answer_source(instance, 12, np.array([3, 4])) == (7, 11)  # nearer the question than the key
    assert answer_source(instance, 12, np.array([5, 6])) == (4, 11)
    assert answer_source(instance, 12, np.array([4, 4])) is None  # nowhere in the text
    # A copy inside an earlier answer does not count (that text is the model's to write).
    spread = inst([0, 7, 7, 0, 1, 2, 0, 7, 7], [4, 5, 7, 8])
    assert last_copy(spread, 7, np.array([1, 2])) is None
    assert last_copy(spread, 7, np.array([7, 7])) == 1


def test_score_cell_records_a_distractor_copied_from_a_passkey_prompt():
    tokenizer = task_tokenizer()
    task = Passkey(tokenizer, 5, distractors=4)
    ev = EvalConfig()
    ev.tasks.samples = 1
    instance = eval_instance(task, ev.tasks.seed, 128, 0.0, 0)
    (start, end), = answer_spans(instance)
    key = instance.tokens[start:end]
    digits = set(tokenizer.encode("0123456789"))
    numbers = [i for i in range(start - 5) if all(int(t) in digits for t in instance.tokens[i:i + 5])
               and not (instance.tokens[i:i + 5] == key).all() and int(instance.tokens[i + 5]) not in digits
               and (i == 0 or int(instance.tokens[i - 1]) not in digits)]
    assert len(numbers) == 4  # the distractors; the key sits at depth 0, so all are nearer the question
    table = [0] * 129
    table[start - 1:end - 1] = instance.tokens[numbers[0]:numbers[0] + 5].tolist()  # the model answers a distractor
    row = score_cell(Table(table, vocab=tokenizer.vocab_size), task, 128, 0.0, ev)
    key_at = last_copy(instance, start, key)
    assert row["correct"] == 0 and row["copied"] == [(start - numbers[0], start - key_at)]
    assert start - numbers[0] < start - key_at
    distractor = tokenizer.decode(instance.tokens[numbers[0]:numbers[0] + 5].tolist())
    assert row["wrote"] == [[tokenizer.decode(key.tolist()), distractor]] and distractor.isdigit()


def cell(run, length, depth, first_error, copied, answer=5, status="ok"):
    return {"run": run, "length": length, "depth": depth, "status": status, "total": len(first_error),
            "first_error": first_error, "answer_tokens": [answer] * len(first_error), "copied": copied}


def test_the_report_table_counts_copies_and_nearer_ones_with_a_random_pick_baseline():
    right, wrong = 5, 0
    per_run = {
        "a": {256: [cell("a", 256, 0.0, [right, wrong, wrong, wrong], [None, [10, 200], [300, 200], None])]},
        "b": {256: [cell("b", 256, 1.0, [wrong, wrong, right, right], [[50, 5], None, None, None])]},
    }
    t = tally(per_run, 256)
    assert t["runs"] == {"a": [4, 3, 2, 1], "b": [4, 2, 1, 0]}
    # depth 0: a wrong candidate is always nearer (1 - 0), depth 1: never; copied answers at 0, 0, 1
    assert t["baseline"] == 2.0
    lines = answers_section("passkey", {"ALiBi": per_run}, {"ALiBi": per_run})
    row = next(line for line in lines if line.startswith("| ALiBi | 256"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[2] == "2/2" and cells[3] == "5/8"
    assert cells[4].startswith("0.60 [") and cells[4].endswith("(3/5)")
    assert cells[5].startswith("0.33 [") and cells[5].endswith("(1/3)")
    assert cells[6] == "0.67"


def test_the_report_table_says_how_many_seeds_kept_their_answers():
    kept = cell("a", 256, 0.0, [5, 0], [None, [10, 200]])
    old = {k: v for k, v in cell("b", 256, 0.0, [0, 0, 5], [None, None, None]).items() if k != "copied"}
    per_run = {"a": {256: [kept]}, "b": {256: [old]}}  # b was scored before wrong answers were kept
    lines = answers_section("multikey", {"ALiBi": per_run}, {"ALiBi": per_run})
    cells = [c.strip() for c in next(line for line in lines if line.startswith("| ALiBi | 256")).strip("|").split("|")]
    assert cells[2] == "1/2" and cells[3] == "1/2"  # one seed of two; b's two wrong answers are not counted


def test_the_report_shows_the_first_wrong_answers_of_a_rows_first_seed():
    first = cell("a", 256, 0.0, [5, 0, 2], [None, None, [3, 9]])
    first["wrote"] = [None, ["33775", "37373"], ["76014", "76666"]]
    later = cell("a", 256, 1.0, [1, 5], [None, None])
    later["wrote"] = [["12345", "12000"], None]
    other = cell("b", 256, 0.0, [0], [None])
    other["wrote"] = [["55555", "11111"]]
    per_run = {"b": {256: [other]}, "a": {256: [first, later]}}
    lines = answers_section("passkey", {"RoPE": per_run}, {"RoPE": per_run})
    assert "| RoPE | 256 | `33775` → `37373`; `76014` → `76666`; `12345` → `12000` |" in lines
    old = {"a": {256: [{k: v for k, v in first.items() if k != "wrote"}]}}  # scored before answers were kept
    assert not any(line.startswith("| row | length | asked") for line in answers_section("passkey", {"x": old}, {"x": old}))


def test_no_table_without_checked_cells_and_no_baseline_without_depths():
    old = {"a": {64: [{k: v for k, v in cell("a", 64, 0.0, [0, 5], [[3, 9], None]).items() if k != "copied"}]}}
    assert answers_section("passkey", {"x": old}, {"x": old}) == []
    chains = {"a": {64: [cell("a", 64, None, [0, 0], [[3, 9], None])]}}
    lines = answers_section("vartrack", {}, {"RoPE": chains})
    row = next(line for line in lines if line.startswith("| RoPE (not learned: 1 seed) | 64"))
    assert row.rstrip().endswith("| – |") and "(1/2)" in row


def test_tasks_without_candidates_record_no_copies():
    tokenizer = task_tokenizer()
    ev = EvalConfig()
    ev.tasks.samples = 2
    model = Transformer(tiny_config("rope", vocab_size=tokenizer.vocab_size)).eval()
    assert not {"copied", "wrote"} & set(score_cell(model, TASKS["copy"](tokenizer), 32, None, ev))
    assert not {"copied", "wrote"} & set(score_cell(model, Passkey(tokenizer, 5), 32, 0.5, ev))  # no distractors: no choice
    assert {"copied", "wrote"} <= set(score_cell(model, Passkey(tokenizer, 5, distractors=2), 64, 0.5, ev))
    for name in ("multikey", "vartrack"):  # the haystack tasks decode their answers with their tokenizer too
        row = score_cell(model, TASKS[name](tokenizer), 128, 0.5 if name == "multikey" else None, ev)
        assert len(row["wrote"]) == 2 and any(w is not None for w in row["wrote"])  # an untrained model errs
        assert all(w is None or all(isinstance(t, str) and t for t in w) for w in row["wrote"])
