"""The claims check (analysis/claims.py): hand-made sentences, then README.md and every committed reading."""

from pathlib import Path

import pytest

from analysis.claims import (VERDICT_WORDS, check_files, check_text, claim_words, default_paths, has_evidence, units,
                             warning_lines)

ROOT = Path(__file__).resolve().parents[1]


def flagged(text: str) -> list[str]:
    return [f.text for f in check_text(text)]


# -- flagged: a verdict or mechanism word with no decided row and no lead -----------------------------------

@pytest.mark.parametrize("sentence", [
    "The one variant that moves entropy is DS filter (p 0.031).",
    "pass@8 falls in every arm.",
    "At equal tokens it is level (−0.6 [−1.2, +0.0], p = 0.057).",
    "An effect of naive GRPO's whole decline is excluded for every one of them.",
    "Dynamic sampling reproduces the paper's direction: +2.8 points, p = 0.002.",   # an unadjusted p only
    "CISPO harms accuracy here, p = 0.031.",
    "Only DS filter, and downward.",
    "Stale rollouts leave entropy where it was, and bypass raises clipping by 1.4 points.",
    "TIS lowers pass@k at every k.",
    "The gap grows over training in one arm of six (p = 0.031, unadjusted).",
    "Overlong filtering and Clip-Higher are **bounded nulls** within ±1 point.",
    "The finding replicates on the fresh split.",
    "DS filter moves entropy, a lead (p 0.031, q = 0.34).",        # q above 0.10: not a lead
    "DS filter moves entropy (p 0.031, q = 0.06).",                # a q without the word lead
    "Dynamic sampling reproduces (p_Holm ≤ 0.05).",                # a threshold, not a value
    "Per generated token it is not level with the arm before it.",
    "Entropy does not move.",
])
def test_a_claim_without_a_decided_row_or_lead_is_flagged(sentence):
    assert flagged(sentence) == [sentence]


def test_headings_table_rows_and_code_lines_are_units():
    md = ("## Entropy does not move\n\n"
          "| arm | verdict |\n|---|---|\n| DS filter | moves entropy |\n\n"
          "```text\nclipping rises in every arm\n```\n")
    assert flagged(md) == ["Entropy does not move", "| DS filter | moves entropy |", "clipping rises in every arm"]
    kinds = [u.kind for u in units(md)]
    assert kinds == ["heading", "table", "table", "table", "code"]


def test_a_bold_run_in_heading_is_one_unit_with_its_sentence():
    md = "**Entropy does not move:** last-quarter entropy, stale − synchronous, is +0.002 (p 0.5).\n"
    assert len(flagged(md)) == 1
    md = "**Dynamic sampling: reproduces.** +2.2 [+1.2, +3.2], p_Holm = 0.010.\n"
    assert flagged(md) == []


def test_sentences_are_split_and_located():
    md = ("First line, nothing here.\nThe soft punishment harms here. It costs\n2.8 points, e.g. on arith-eval, "
          "vs. Dr. GRPO's.\n")
    fl = check_text(md)
    assert [(f.line, f.text) for f in fl] == [(2, "The soft punishment harms here.")]


# -- not flagged --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("sentence", [
    # a decided row: p_Holm with its value (a TOST p_Holm too)
    "Dynamic sampling **reproduces** (+2.8 [+1.9, +3.8], p_Holm = 0.012).",
    "The soft punishment harms here: −2.8, p Holm 0.012.",
    "Overlong filtering is a bounded null (TOST p_Holm = 0.012).",
    "DAPO vs naive GRPO is inconclusive there and does not reproduce (p_Holm = 0.062).",
    "Dynamic sampling reproduces, p_Holm < 0.001.",
    # a lead: the word and its q
    "DS filter's entropy moves down, a lead: −0.033 [−0.051, −0.012], p = 0.031, q = 0.06.",
    "Lead: the lag's k3 grows at k = 2 (p 0.031, q 0.055).",
    # the vocabulary defined
    "p_Holm ≤ 0.05 in the paper's direction: **reproduces**; in the other: **harms here**.",
    "A significant change reads **differs**, never **acts**, when q ≤ 0.10 or p ≤ 0.05.",
    # no verdict word, or another sense of it
    "The exact sign-flip interval is labelled with its true level (96.9% at 6 pairs).",
    "It covers the mean at the 95% level.",
    "Holm's first level is α/m; the one-sided level is 1/2^n.",
    "A level over seeds gets a Student-t interval.",
    "The token-level loss and a top-level key.",
    "Set `algo.rollout_correction.level` to token.",
    "Accelerate only launches the processes; sqlite only works here because every writer is local.",
    "Only when both arms ran a seed is it paired.",
    "It ran on seed 0 only (below).",
    "Clip-Higher binds on only 0.036 % of tokens.",
    "Preemption checkpoints and requeues, with bounded retries.",
    "The key's help says when it is a no-op.",
    "One verdict from those tests (reproduces / harms here / bounded null / inconclusive).",
    "Which variant moves entropy?",
    'The report\'s sections "Do the mechanisms act?" and "Does the policy learn?" are exploratory.',
    "Reproduce and ablate DAPO against its GRPO baseline.",
    "The lower bound of the interval is below zero.",
])
def test_not_flagged(sentence):
    assert flagged(sentence) == []


def test_the_decision_rule_paragraph_defines_the_vocabulary():
    md = ("**Decision rule.** The family is tested; a verdict comes from the adjusted p alone: "
          "in the paper's direction: **reproduces**. Otherwise it is bounded or inconclusive.\n\n"
          "Dynamic sampling reproduces.\n")
    assert flagged(md) == ["Dynamic sampling reproduces."]


def test_a_lead_needs_its_q_at_most_0_10():
    assert has_evidence("a lead (p 0.031, q = 0.10)")
    assert not has_evidence("a lead (p 0.031, q = 0.11)")
    assert not has_evidence("a lead (p 0.031, q ≤ 0.10)")
    assert not has_evidence("p = 0.031, q = 0.05")


def test_every_word_of_the_list_is_matched_whole_and_case_insensitive():
    for key in VERDICT_WORDS:
        if key == "only":
            assert claim_words("ONLY the variant did.") == (key,)
            continue
        assert claim_words(f"The variant {key.upper()} it.") == (key,), key
        assert claim_words(f"The variant un{key}x it.") == (), key
    assert claim_words("the token-level loss") == ()


def test_warning_lines_name_file_line_and_words(tmp_path):
    f = tmp_path / "reading.md"
    f.write_text("Setup.\n\n**pass@8 falls in every arm.** It ends lower.\n", encoding="utf-8")
    lines = warning_lines([f])
    assert lines == [f"{f}:3: claims check: falls without a p_Holm or a lead with its q: "
                     "**pass@8 falls in every arm.** It ends lower."]
    assert warning_lines([]) == []


# -- the committed prose -------------------------------------------------------------------------------------

def test_readme_and_every_reading_pass_the_claims_check():
    paths = default_paths(ROOT)
    assert ROOT / "README.md" in paths and len(paths) >= 9
    flags = check_files(paths)
    listing = "\n".join(f"{p.relative_to(ROOT)}:{f.line}: [{', '.join(f.words)}] {f.text}" for p, f in flags)
    assert not flags, (f"{len(flags)} sentence(s) state a verdict or mechanism word without a decided row "
                       f"(p_Holm) or a lead (the word 'lead' and its q ≤ 0.10); cite one or drop the word "
                       f"(analysis/claims.py):\n{listing}")
