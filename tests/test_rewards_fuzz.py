"""Fuzzing dapo.data.rewards: whatever the text (arbitrary unicode, ~1 MB strings, deeply nested
braces, thousands of "Answer:" lines), scorers return exactly +1.0 or -1.0, quickly, and the
linear-time Minerva normalization agrees with verl's regexes."""

import re

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dapo.data import rewards

FUZZ = settings(max_examples=100, deadline=1000, database=None, suppress_health_check=[HealthCheck.too_slow])
MB = 1 << 20

# Pieces that steer the scorer's regexes and normalization rules.
PIECES = [
    "Answer:", "answer :", "ANSWER:\n", "Answer: 1", "\n", " ", "  ", "$", "{", "}", "=", ",",
    "\\boxed{", "\\text{", "\\textbf{", "\\overline{", "\\frac", "frac", "\\sqrt", "sqrt",
    "\\$", ".$", "an ", "a ", "\\ ", "mbox", "\\text{and}", "^\\circ", "{,}", "cm", "\\!",
    "1", "42", "-", "\u2212", "x", "é", "\U0001F600", "\r", "\t",
]
mixed = st.lists(st.one_of(st.sampled_from(PIECES), st.text(max_size=4)), max_size=40).map("".join)


@st.composite
def huge(draw):
    """mixed text around one piece repeated up to ~1 MB."""
    piece = draw(st.sampled_from(PIECES))
    repeat = draw(st.integers(1, MB // len(piece)))
    return draw(mixed) + piece * repeat + draw(mixed)


nested = st.integers(0, 50_000).map(lambda d: "Answer: \\boxed{" + "{" * d + "1" + "}" * d + "}")
unbalanced = st.integers(0, MB).map(lambda d: "\\boxed{" * 3 + "{" * d)
many_answers = st.integers(1, 50_000).map(lambda n: "Answer: 1\n" * n + "Answer: 2")
responses = st.one_of(st.text(), mixed, huge(), nested, unbalanced, many_answers)
truths = st.one_of(st.sampled_from(["1", "2", "42", "-5", "\\frac{1}{2}", ""]), st.text(max_size=20), mixed)


@FUZZ
@given(response=responses, truth=truths)
def test_dapo_score_total(response, truth):
    score, pred = rewards.dapo_score_detail(response, truth)
    assert type(score) is float and score in (1.0, -1.0)
    assert rewards.dapo_score(response, truth) == score
    if score == 1.0:
        assert pred == rewards.normalize_final_answer(truth)


@FUZZ
@given(response=mixed, truth=responses)
def test_dapo_score_total_on_huge_ground_truths(response, truth):
    assert rewards.dapo_score(response, truth) in (1.0, -1.0)


# verl's normalize_final_answer, regex for regex (verl/utils/reward_score/math_dapo.py),
# as the slow reference for our linear-time version. Only fed short strings.
VERL_REGEXES = [
    (r"(.*?)(\$)(.*?)(\$)(.*)", "$\\3$"),
    (r"(\\text\{)(.*?)(\})", "\\2"),
    (r"(\\textbf\{)(.*?)(\})", "\\2"),
    (r"(\\overline\{)(.*?)(\})", "\\2"),
    (r"(\\boxed\{)(.*)(\})", "\\2"),
    (r"(frac)([^{])(.)", "frac{\\2}{\\3}"),
    (r"(sqrt)([^{])", "sqrt{\\2}"),
]


def verl_normalize(answer):
    s = answer.split("=")[-1]
    for before, after in rewards._SUBSTITUTIONS:
        s = s.replace(before, after)
    for expr in rewards._REMOVED_EXPRESSIONS:
        s = s.replace(expr, "")
    for pattern, repl in VERL_REGEXES:
        s = re.sub(pattern, repl, s)
    s = s.replace("$", "")
    if s.replace(",", "").isdigit():
        s = s.replace(",", "")
    return s.strip()


@settings(max_examples=300, deadline=None, database=None)
@given(text=mixed)
def test_normalize_matches_verl_regexes(text):
    assert rewards.normalize_final_answer(text) == verl_normalize(text)


def test_normalize_matches_verl_regexes_examples():
    for text in ["$a$ and $b$\n$c$ x", "\\text{a}\\text{b\n}c}", "\\boxed{1}}\n\\boxed{2", "\\boxed{\\boxed{3}}",
                 "x = $\\frac12$", "\\text{\\textbf{7}}", "frac\nab sqrt\nx", "1,000 = 2,000"]:
        assert rewards.normalize_final_answer(text) == verl_normalize(text)


boxed_responses = st.one_of(
    mixed.map(lambda s: f"\\boxed{{{s}}}"),
    st.text(max_size=30).map(lambda s: f"The answer is \\boxed{{{s}}}"),
    st.integers(0, 400).map(lambda d: "\\boxed{" + "{" * d + "2" + "}" * d + "}"),
    responses,
)


@settings(max_examples=30, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(response=boxed_responses, truth=truths)
def test_math_verify_score_total(response, truth):
    # deadline=None: a timed-out call restarts its worker (~1 s); time is bounded by timeout_s
    assert rewards.math_verify_score(response, truth, timeout_s=1.0) in (1.0, -1.0)
