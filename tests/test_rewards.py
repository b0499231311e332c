"""dapo.data.rewards: the DAPO (Minerva) scorer and the math-verify scorer."""

import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from dapo.data import rewards
from dapo.data.rewards import dapo_score, dapo_score_detail, extract_answer, math_verify_score

MB = 1 << 20


# ----------------------------------------------------------------------------------------
# DAPO scorer
# ----------------------------------------------------------------------------------------

@pytest.mark.parametrize(
    "response, truth, score, pred",
    [
        # "1,000": only digits and commas remain -> commas dropped
        ("So the total is 1000.\nAnswer: 1,000", "1000", 1.0, "1000"),
        # $..$ kept, \boxed{..} unwrapped, $ dropped
        ("Answer: $\\boxed{42}$", "42", 1.0, "42"),
        # two Answer lines: the last one wins
        ("Answer: 3\nWait, let me recheck.\nAnswer: 5", "5", 1.0, "5"),
        ("Answer: 3\nWait, let me recheck.\nAnswer: 5", "3", -1.0, "5"),
        # no Answer line at all
        ("The answer is 5.", "5", -1.0, None),
        # case-insensitive, and "x = " is cut at the last "="
        ("ANSWER: x = 7", "7", 1.0, "7"),
        # text after the answer *line* is ignored ...
        ("Answer: 12\nI hope this helps!", "12", 1.0, "12"),
        # ... text on the same line is part of the answer
        ("Answer: 12 because 3*4", "12", -1.0, "12because3*4"),
        # \s* after the colon crosses a newline (verl's regex does too)
        ("Answer:\n42", "42", 1.0, "42"),
        # Minerva shorthand: \frac12 -> \frac{1}{2}; but 0.5 is a different string
        ("Answer: \\frac12", "\\frac{1}{2}", 1.0, "\\frac{1}{2}"),
        ("Answer: 0.5", "\\frac{1}{2}", -1.0, "0.5"),
        # unicode minus (U+2212) is not folded: exact string comparison, as verl
        ("Answer: \u22125", "-5", -1.0, "\u22125"),
        ("Answer: -5", "-5", 1.0, "-5"),
        # units and degrees are removed
        ("Answer: 30^\\circ", "30", 1.0, "30"),
        ("Answer: 5 cm", "5", 1.0, "5"),
        ("Answer: \\text{(B)}", "(B)", 1.0, "(B)"),
    ],
)
def test_dapo_score_cases(response, truth, score, pred):
    assert dapo_score_detail(response, truth) == (score, pred)
    assert dapo_score(response, truth) == score
    assert extract_answer(response) == pred


def test_dapo_score_reads_only_the_last_300_characters():
    answer = "Answer: 7\n"
    assert dapo_score(answer + "x" * (300 - len(answer)), "7") == 1.0  # just inside
    assert dapo_score(answer + "x" * (301 - len(answer)), "7") == -1.0  # "A" cut off


@pytest.mark.parametrize(
    "raw, normalized",
    [
        ("x = 5", "5"),
        ("\\$1,000", "1000"),
        ("1,2", "12"),  # Minerva quirk: a comma-separated pair of digits becomes one number
        ("(1, 2)", "(1,2)"),
        ("\\sqrt2", "\\sqrt{2}"),
        ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
        ("\\text{Monday}", "Monday"),
        ("\\textbf{A}", "A"),
        ("\\overline{CD}", "CD"),
        ("5 integers", "5"),  # "5 " -> "5" (spaces), then "integers" removed
        ("an integer 7", "integer7"),  # "an " removed, but only the plural is a unit
        ("10 dollars", "10"),
        ("5\\%", "5\\%"),
    ],
)
def test_normalize_final_answer(raw, normalized):
    assert rewards.normalize_final_answer(raw) == normalized


def test_dapo_score_huge_response_is_fast():
    response = "x" * MB + "\nAnswer: 9"
    start = time.perf_counter()
    assert dapo_score(response, "9") == 1.0
    assert dapo_score("{" * MB, "9") == -1.0
    assert dapo_score("Answer: 1\n" * (MB // 10), "1") == 1.0
    assert time.perf_counter() - start < 0.5


def test_dapo_score_never_raises_on_bad_types():
    assert dapo_score_detail(None, "1") == (-1.0, None)  # type: ignore[arg-type]
    assert dapo_score("Answer: 1", 1) == 1.0  # type: ignore[arg-type]  # numbers are stringified


def test_normalize_huge_ground_truth_is_linear():
    # verl's regexes take ~1 minute on 100 kB without "$"; ours must not
    start = time.perf_counter()
    for text in ("x" * MB, "$" + "x" * MB, "\\text{" * (MB // 6), "\\boxed{" * (MB // 7)):
        rewards.normalize_final_answer(text)
    assert time.perf_counter() - start < 2.0


# ----------------------------------------------------------------------------------------
# math-verify scorer
# ----------------------------------------------------------------------------------------

@pytest.mark.parametrize(
    "response, truth, score",
    [
        ("so the answer is $\\boxed{\\frac{1}{2}}$.", "0.5", 1.0),  # LaTeX fraction vs decimal
        ("\\boxed{0.5}", "\\frac{1}{2}", 1.0),
        ("\\boxed{\\dfrac{\\sqrt{2}}{2}}", "\\frac{\\sqrt2}{2}", 1.0),
        ("\\boxed{\u22125}", "-5", 1.0),  # unicode minus is understood here
        ("\\boxed{1,000}", "1000", 1.0),
        ("\\boxed{(x+1)^2}", "x^2+2x+1", 1.0),
        ("first \\boxed{4}, finally \\boxed{3}", "3", 1.0),  # the last box counts
        ("\\boxed{3}", "4", -1.0),
        ("The answer is 3.", "3", -1.0),  # no box
        ("\\boxed{3", "3", -1.0),  # unbalanced box
        ("\\boxed{}", "0", -1.0),
        ("\\boxed{3}", "\\boxed{3}", 1.0),  # a boxed ground truth is used as is
    ],
)
def test_math_verify_cases(response, truth, score):
    assert math_verify_score(response, truth) == score


def test_math_verify_huge_and_nested_inputs_are_fast():
    start = time.perf_counter()
    assert math_verify_score("x" * MB + "\\boxed{7}", "7") == 1.0
    assert math_verify_score("\\boxed{" + "{" * MB, "7") == -1.0  # never closes
    assert math_verify_score("\\boxed{" + "{" * 500 + "7" + "}" * 501, "7") in (1.0, -1.0)
    assert time.perf_counter() - start < 5.0


def test_math_verify_timeout_kills_runaway_sympy():
    # 9^(9^(9^9)) is a bigint power inside one C call: neither SIGALRM nor a thread stops it;
    # the worker process is killed instead, and the next call gets a fresh one.
    start = time.perf_counter()
    assert math_verify_score("\\boxed{9^{9^{9^{9}}}}", "1", timeout_s=0.5) == -1.0
    assert time.perf_counter() - start < 2.0
    assert math_verify_score("\\boxed{2}", "2") == 1.0


def test_math_verify_off_the_main_thread():
    cases = [("\\boxed{\\frac{1}{2}}", "0.5", 5.0), ("\\boxed{3}", "4", 5.0), ("\\boxed{9^{9^{9^{9}}}}", "1", 0.5)]
    with ThreadPoolExecutor(max_workers=2) as pool:
        start = time.perf_counter()
        scores = list(pool.map(lambda c: math_verify_score(c[0], c[1], timeout_s=c[2]), cases))
    assert scores == [1.0, -1.0, -1.0]
    assert time.perf_counter() - start < 30.0  # includes starting two workers


def test_math_verify_never_raises(monkeypatch):
    assert math_verify_score(None, "1") == -1.0  # type: ignore[arg-type]

    def broken():
        raise RuntimeError("cannot start")

    monkeypatch.setattr(rewards, "_Worker", broken)
    monkeypatch.setattr(rewards._workers, "worker", None, raising=False)
    assert math_verify_score("\\boxed{1}", "1") == -1.0


# ----------------------------------------------------------------------------------------
# Registry and import hygiene
# ----------------------------------------------------------------------------------------

def test_scorer_registry():
    assert rewards.get_scorer("dapo") is dapo_score
    assert rewards.get_scorer("math_verify") is math_verify_score
    with pytest.raises(ValueError, match="dapo.*math_verify"):
        rewards.get_scorer("exact")


def test_import_does_not_pull_torch_or_math_verify():
    code = (
        "import sys, dapo.data.rewards as r; r.dapo_score('Answer: 1', '1'); "
        "bad = {'torch', 'math_verify', 'sympy'} & set(sys.modules); assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
