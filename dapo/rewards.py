"""Correctness rewards: +1.0 if the response's final answer matches the ground truth, else -1.0.

Two scorers, one registry (`SCORERS`, `get_scorer`):

- `dapo_score`: the DAPO scorer (verl `verl/utils/reward_score/math_dapo.py`, Minerva-style
  normalization from Lewkowycz et al. 2022). It keeps the last 300 characters of the
  response, takes the last match of `Answer\\s*:\\s*([^\\n]+)` (case-insensitive), normalizes
  both sides and compares the strings exactly.
- `math_verify_score`: `\\boxed{}` answers checked symbolically by the math-verify library
  (MATH-500, GSM8K), with a wall-clock limit.

Scorers never raise and always return exactly +1.0 or -1.0. This module does not import
torch; math-verify (and through it sympy) is imported on the first `math_verify_score` call.
"""

from __future__ import annotations

import re
import signal
import threading
import time
from typing import Callable

__all__ = [
    "SCORERS",
    "dapo_score",
    "dapo_score_detail",
    "extract_answer",
    "get_scorer",
    "last_boxed",
    "math_verify_score",
    "normalize_final_answer",
]

# --------------------------------------------------------------------------------------
# DAPO / Minerva scorer
# --------------------------------------------------------------------------------------

TAIL_CHARS = 300  # verl: "The longest answer in MATH-500 has 159 characters"
_ANSWER_RE = re.compile(r"Answer\s*:\s*([^\n]+)", re.IGNORECASE)

# Minerva normalization tables, applied in order (same entries and order as verl's
# math_dapo.py; the order matters, e.g. "an " is dropped before spaces are).
_SUBSTITUTIONS: tuple[tuple[str, str], ...] = (
    ("an ", ""), ("a ", ""), (".$", "$"), ("\\$", ""), ("\\ ", ""), (" ", ""),
    ("mbox", "text"), (",\\text{and}", ","), ("\\text{and}", ","), ("\\text{m}", "\\text{}"),
)
_REMOVED_EXPRESSIONS: tuple[str, ...] = (
    "square", "ways", "integers", "dollars", "mph", "inches", "hours", "km", "units",
    "\\ldots", "sue", "points", "feet", "minutes", "digits", "cents", "degrees", "cm", "gm",
    "pounds", "meters", "meals", "edges", "students", "childrentickets", "multiples",
    "\\text{s}", "\\text{.}", "\\text{\ns}", "\\text{}^2", "\\text{}^3", "\\text{\n}",
    "\\text{}", "\\mathrm{th}", "^\\circ", "^{\\circ}", "\\;", ",\\!", "{,}", '"', "\\dots",
)
_FRAC_SHORTHAND = re.compile(r"(frac)([^{])(.)")  # \frac12 -> \frac{1}{2}
_SQRT_SHORTHAND = re.compile(r"(sqrt)([^{])")  # \sqrt2 -> \sqrt{2}


# verl runs five more regexes here: r"(.*?)(\$)(.*?)(\$)(.*)" -> r"$\3$", then
# r"(\\text\{)(.*?)(\})" -> r"\2" and the same for \textbf and \overline, then
# r"(\\boxed\{)(.*)(\})" -> r"\2". None of them crosses a newline, and re.sub makes each
# quadratic in the line length when it fails to match (a 100 kB ground truth takes a
# minute). The helpers below give the same output in linear time, one line at a time;
# tests/test_rewards_fuzz.py checks them against the regexes.
def _first_dollar_span(line: str) -> str:
    r"""(.*?)(\$)(.*?)(\$)(.*) -> $\3$ : a line with two "$" keeps only its first $..$ span."""
    parts = line.split("$", 2)
    return f"${parts[1]}$" if len(parts) == 3 else line


def _unwrap_lazy(line: str, prefix: str) -> str:
    r"""(prefix)(.*?)(\}) -> \2 : each `prefix` up to the nearest "}" becomes its content."""
    out, pos = [], 0
    while (i := line.find(prefix, pos)) >= 0:
        j = line.find("}", i + len(prefix))
        if j < 0:
            break
        out += [line[pos:i], line[i + len(prefix) : j]]
        pos = j + 1
    out.append(line[pos:])
    return "".join(out)


def _unwrap_greedy(line: str, prefix: str) -> str:
    r"""(prefix)(.*)(\}) -> \2 : the first `prefix` up to the line's last "}" becomes its content."""
    i, j = line.find(prefix), line.rfind("}")
    if i < 0 or j < i + len(prefix):
        return line
    return line[:i] + line[i + len(prefix) : j] + line[j + 1 :]


def _unwrap_line(line: str) -> str:
    line = _first_dollar_span(line)
    for prefix in ("\\text{", "\\textbf{", "\\overline{"):
        line = _unwrap_lazy(line, prefix)
    return _unwrap_greedy(line, "\\boxed{")


def normalize_final_answer(answer: str) -> str:
    """Minerva normalization of one final-answer string, linear time in its length.

    Keeps what follows the last "=", applies the substitution and removal tables, keeps the
    first $..$ span, unwraps \\text, \\textbf, \\overline and (outermost) \\boxed, expands
    \\fracab / \\sqrta shorthand, drops "$", and turns "1,000" into "1000" when only digits
    and commas remain.
    """
    s = answer.split("=")[-1]
    for before, after in _SUBSTITUTIONS:
        s = s.replace(before, after)
    for expr in _REMOVED_EXPRESSIONS:
        s = s.replace(expr, "")
    s = "\n".join(_unwrap_line(line) for line in s.split("\n"))
    s = _FRAC_SHORTHAND.sub(r"frac{\2}{\3}", s)
    s = _SQRT_SHORTHAND.sub(r"sqrt{\2}", s)
    s = s.replace("$", "")
    if s.replace(",", "").isdigit():
        s = s.replace(",", "")
    return s.strip()


def extract_answer(response: str) -> str | None:
    """The normalized prediction of `response`, or None when it has no "Answer:" line.

    Only the last `TAIL_CHARS` (300) characters are read; of the "Answer:" matches there the
    last one wins; its text runs to the end of that line. Used for majority votes (cons@k).
    """
    if not isinstance(response, str):
        return None
    matches = _ANSWER_RE.findall(response[-TAIL_CHARS:])
    return normalize_final_answer(matches[-1]) if matches else None


def dapo_score_detail(response: str, ground_truth: str) -> tuple[float, str | None]:
    """(score, pred): score +1.0 iff the normalized prediction equals the normalized ground
    truth, else -1.0; pred is `extract_answer(response)` (None: no "Answer:" found).

    Differs from verl only where no answer is found: verl compares the placeholder
    "[INVALID]" with the ground truth, here that response always scores -1.0.
    """
    try:
        pred = extract_answer(response)
        if pred is None:
            return -1.0, None
        return (1.0 if pred == normalize_final_answer(str(ground_truth)) else -1.0), pred
    except Exception:  # defensive: a scorer must never take down a rollout
        return -1.0, None


def dapo_score(response: str, ground_truth: str) -> float:
    """+1.0 / -1.0 with the DAPO scorer's semantics (see `dapo_score_detail`)."""
    return dapo_score_detail(response, ground_truth)[0]


# --------------------------------------------------------------------------------------
# math-verify scorer
# --------------------------------------------------------------------------------------

MAX_ANSWER_CHARS = 1000  # a longer \boxed{} content is not an answer; skip the parser


def last_boxed(text: str) -> str | None:
    """Content of the last `\\boxed{...}` in `text` if its braces close within
    `MAX_ANSWER_CHARS` characters, else None (linear time, whatever the input)."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth = 0
    stop = min(len(text), start + len("\\boxed{") + MAX_ANSWER_CHARS + 1)
    for i in range(start + len("\\boxed"), stop):
        ch = text[i]
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return text[start + len("\\boxed{") : i]
    return None  # unbalanced


class _Timeout(BaseException):
    """Raised when the time is up; a BaseException so the parser's `except Exception` lets it through."""


def _call_with_timeout(fn: Callable[[], bool], timeout_s: float) -> bool:
    """fn() within timeout_s seconds, else raise _Timeout.

    On the main thread a SIGALRM interval timer interrupts fn (nothing keeps running);
    elsewhere signals are unavailable, so fn runs in a daemon thread and is abandoned on
    timeout (it finishes in the background; the caller is not held up).
    """
    if threading.current_thread() is threading.main_thread() and hasattr(signal, "setitimer"):

        def on_alarm(signum, frame):
            raise _Timeout()

        old_handler = signal.signal(signal.SIGALRM, on_alarm)
        old_delay, old_interval = signal.setitimer(signal.ITIMER_REAL, timeout_s)
        start = time.monotonic()
        try:
            return fn()
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, old_handler)
            if old_delay > 0:  # someone else's timer was running: give back what is left
                remaining = max(old_delay - (time.monotonic() - start), 1e-3)
                signal.setitimer(signal.ITIMER_REAL, remaining, old_interval)

    result: list[bool] = []
    error: list[BaseException] = []

    def target():
        try:
            result.append(fn())
        except BaseException as e:  # noqa: BLE001 - reported to the caller below
            error.append(e)

    worker = threading.Thread(target=target, daemon=True, name="math-verify")
    worker.start()
    worker.join(timeout_s)
    if worker.is_alive():
        raise _Timeout()
    if error:
        raise error[0]
    return result[0]


def math_verify_score(response: str, ground_truth: str, timeout_s: float = 5.0) -> float:
    """+1.0 if the last `\\boxed{}` of `response` is mathematically equal to `ground_truth`
    according to math-verify, else -1.0 (also on no box, parse failure, any error, or when
    parsing and verifying together take longer than `timeout_s` seconds).

    The ground truth is parsed as `$<ground_truth>$` unless it already holds "$" or
    "\\boxed". math-verify's own signal timeouts are switched off (they fail off the main
    thread); `_call_with_timeout` bounds the whole call instead.
    """
    try:
        boxed = last_boxed(response)
        if boxed is None:
            return -1.0
        gold_text = str(ground_truth)
        if "$" not in gold_text and "\\boxed" not in gold_text:
            gold_text = f"${gold_text}$"

        def check() -> bool:
            from math_verify import parse, verify

            gold = parse(gold_text, parsing_timeout=None)
            pred = parse(f"$\\boxed{{{boxed}}}$", parsing_timeout=None)
            return bool(gold) and bool(pred) and bool(verify(gold, pred, timeout_seconds=None))

        return 1.0 if _call_with_timeout(check, timeout_s) else -1.0
    except BaseException as e:  # never raise; but let Ctrl-C and exit through
        if isinstance(e, (KeyboardInterrupt, SystemExit)):
            raise
        return -1.0


# --------------------------------------------------------------------------------------
# Registry
# --------------------------------------------------------------------------------------

SCORERS: dict[str, Callable[[str, str], float]] = {
    "dapo": dapo_score,
    "math_verify": math_verify_score,
}


def get_scorer(name: str) -> Callable[[str, str], float]:
    """The scorer registered as `name`; ValueError listing the valid names otherwise."""
    try:
        return SCORERS[name]
    except KeyError:
        raise ValueError(f"unknown scorer {name!r}; valid: {sorted(SCORERS)}") from None
