"""Correctness rewards: +1.0 if the response's final answer matches the ground truth, else -1.0.

Two scorers, one registry (`SCORERS`, `get_scorer`):

- `dapo_score`: the DAPO scorer (verl `verl/utils/reward_score/math_dapo.py`, Minerva-style
  normalization from Lewkowycz et al. 2022). It keeps the last 300 characters of the
  response, takes the last match of `Answer\\s*:\\s*([^\\n]+)` (case-insensitive), normalizes
  both sides and compares the strings exactly.
- `math_verify_score`: `\\boxed{}` answers checked symbolically by the math-verify library
  (MATH-500, GSM8K), with a wall-clock limit.

Scorers never raise and always return exactly +1.0 or -1.0, in bounded time. This module
imports neither torch nor math-verify: math-verify (and sympy) run in a worker process.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import re
import select
import subprocess
import sys
import threading
import weakref
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


# math-verify runs in a worker process. Neither math-verify's SIGALRM timeout nor a thread
# can stop sympy inside one C call (\boxed{9^{9^{9^{9}}}} becomes a bigint power that holds
# the GIL for hours; huggingface/Math-Verify#65), so a call that runs out of time kills its
# worker; the next call starts a new one. Each thread has its own worker, so threads score
# in parallel. The worker is `python -m dapo.data.rewards`, fed JSON lines on stdin.
WORKER_START_TIMEOUT_S = 120.0  # importing sympy + math-verify; not counted in timeout_s
WORKER_MEMORY_BYTES = 4 << 30  # address-space limit of a worker (RLIMIT_AS)
_workers = threading.local()  # .worker: this thread's _Worker
_live_workers: "weakref.WeakSet[_Worker]" = weakref.WeakSet()  # all of them, closed at exit


class _Worker:
    """One math-verify worker process (POSIX: uses select on its stdout)."""

    def __init__(self) -> None:
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "dapo.data.rewards"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL, text=True, encoding="utf-8", env=env,
        )
        _live_workers.add(self)
        if self._read_line(WORKER_START_TIMEOUT_S) != "ready":
            self.close()
            logging.getLogger(__name__).error(
                "math-verify worker did not start, so math_verify_score gives -1.0; "
                "`%s -m dapo.data.rewards </dev/null` shows why", sys.executable)
            raise RuntimeError("math-verify worker did not start")

    def _read_line(self, timeout_s: float) -> str | None:
        readable, _, _ = select.select([self.proc.stdout], [], [], timeout_s)
        line = self.proc.stdout.readline() if readable else ""
        return line.strip() or None  # None: out of time, or end of file (the worker died)

    def verify(self, gold: str, pred: str, timeout_s: float) -> str | None:
        """"1" or "0" from the worker, or None if it took longer than timeout_s or died."""
        self.proc.stdin.write(json.dumps({"gold": gold, "pred": pred}) + "\n")
        self.proc.stdin.flush()
        return self._read_line(timeout_s)

    def close(self) -> None:
        if not hasattr(self, "proc"):  # Popen itself failed
            return
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        for pipe in (self.proc.stdin, self.proc.stdout):
            try:
                pipe.close()
            except OSError:  # unflushed data for a dead worker (broken pipe)
                pass

    __del__ = close  # a finished thread's worker goes with it


@atexit.register
def _close_workers() -> None:
    for worker in list(_live_workers):
        worker.close()


def _worker_main() -> None:
    """The worker loop: one {"gold", "pred"} JSON line in, "1" (equal) or "0" out."""
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (WORKER_MEMORY_BYTES, WORKER_MEMORY_BYTES))
    from math_verify import parse, verify

    def check(gold_text: str, pred_text: str) -> bool:
        # math-verify's own SIGALRM timeouts are off: the parent bounds the time.
        gold = parse(gold_text, parsing_timeout=None)
        pred = parse(pred_text, parsing_timeout=None)
        return bool(gold) and bool(pred) and bool(verify(gold, pred, timeout_seconds=None))

    check("$0.5$", "$\\boxed{\\frac{1}{2}}$")  # warm-up: the first parse builds the grammars (~1 s)
    print("ready", flush=True)
    for line in sys.stdin:
        try:
            request = json.loads(line)
            equal = check(request["gold"], request["pred"])
        except Exception:  # includes MemoryError under the RLIMIT_AS cap
            equal = False
        print("1" if equal else "0", flush=True)


def math_verify_score(response: str, ground_truth: str, timeout_s: float = 5.0) -> float:
    """+1.0 if the last `\\boxed{}` of `response` is mathematically equal to `ground_truth`
    according to math-verify, else -1.0 (also on no box, parse failure, any error, or when
    parsing and verifying take longer than `timeout_s` seconds).

    The ground truth is parsed as `$<ground_truth>$` unless it already holds "$" or
    "\\boxed". Safe to call from any thread; the work happens in a per-thread worker
    process (started on first use, ~1 s, not counted in timeout_s).
    """
    try:
        boxed = last_boxed(response)
        if boxed is None:
            return -1.0
        gold = str(ground_truth)
        if "$" not in gold and "\\boxed" not in gold:
            gold = f"${gold}$"
        worker = getattr(_workers, "worker", None) or _Worker()
        _workers.worker = worker
        try:
            answer = worker.verify(gold, f"$\\boxed{{{boxed}}}$", timeout_s)
        except OSError:  # the worker died earlier (broken pipe)
            answer = None
        if answer is None:  # out of time or dead: this worker is done for
            _workers.worker = None
            worker.close()
        return 1.0 if answer == "1" else -1.0
    except Exception:
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


if __name__ == "__main__":
    _worker_main()
