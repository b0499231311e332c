"""Pre-registration as a record (dapo.sweep.declaration) and the report's sentence derived from it (analysis.declared)."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import pytest

from analysis.declared import NO_RECORD, declaration_facts, declaration_sentence
from dapo.commands.sweep import main as sweep_main
from dapo.config import ConfigError
from dapo.sweep import launcher
from dapo.sweep.cluster import load_profile
from dapo.sweep.declaration import declarations_dir, declare, read_declarations
from dapo.sweep.spec import expand, load_spec
from tests.test_sweep import error_of, write_spec

T = datetime(2026, 12, 6, 7, 0, tzinfo=timezone.utc)


def test_a_declaration_is_written_once_and_a_change_makes_a_new_one(tmp_path):
    spec = load_spec(write_spec(tmp_path, family=[["grpo", "clip_higher"]]))
    out = tmp_path / "out"
    rec, new = declare(spec, out, now=T, commit="abc")
    assert new and rec["content"]["family"] == [["grpo", "clip_higher"]]
    assert rec["content"]["run_ids"] == sorted(j.run_id for j in expand(spec, out))
    again, new2 = declare(spec, out, now=T + timedelta(hours=1), commit="abc")
    assert not new2 and again["id"] == rec["id"]                    # unchanged content: the same record
    spec2 = load_spec(write_spec(tmp_path, family=[["grpo", "clip_higher"]], margins={"eval/arith-eval/avg_at_2": 2.0}))
    rec2, new3 = declare(spec2, out, now=T + timedelta(hours=2), commit="def")
    assert new3 and rec2["supersedes"] == rec["id"]
    recs = read_declarations(declarations_dir(out, spec.name))
    assert [r["id"] for r in recs] == [rec["id"], rec2["id"]]       # the old one is kept


def test_submit_declares_before_the_first_job_starts_and_jobs_carry_the_id(tmp_path, monkeypatch):
    path = write_spec(tmp_path, stopping={"looks": [2], "spending": "pocock"})
    out = tmp_path / "out"
    seen = {}

    def fake_run_local(spec, profile, params, folder, todo, *a, **k):
        seen["records"] = read_declarations(declarations_dir(out, spec.name))
        seen["tags"] = {j.config.logging.declaration for j in todo}
    monkeypatch.setattr(launcher, "_run_local", fake_run_local)
    assert sweep_main(["submit", str(path), "--cluster", "local", "--output", str(out)]) in (0, 1, 2)
    assert len(seen["records"]) == 1
    assert seen["tags"] == {seen["records"][0]["id"]}


def test_stopping_is_validated(tmp_path):
    assert "looks must increase" in error_of(write_spec(tmp_path, stopping={"looks": [2, 2]}))
    assert "the last look needs 3 seeds" in error_of(write_spec(tmp_path, stopping={"looks": [2, 3]}))
    assert "spending" in error_of(write_spec(tmp_path, stopping={"looks": [2], "spending": "bayes"}))
    assert "unknown key" in error_of(write_spec(tmp_path, stopping={"looks": [2], "rule": 1}))
    with pytest.raises(ConfigError):
        load_spec(write_spec(tmp_path, stopping={"looks": [2], "alpha": 1.5}))


def _rec(t, family="default", margins=None, id_="r"):
    return {"id": id_, "time": t.isoformat(), "hash": id_, "commit": "c0ffee",
            "content": {"family": family, "margins": margins or {}, "stopping": None}}


def test_the_sentence_says_before_only_where_the_times_say_so():
    times = {"a": {"start": (T + timedelta(minutes=5)).isoformat(), "end": (T + timedelta(minutes=15)).isoformat()},
             "b": {"start": (T + timedelta(minutes=6)).isoformat(), "end": (T + timedelta(minutes=16)).isoformat()}}
    s = declaration_sentence([_rec(T)], times, ["a", "b"])
    assert "before the first run started (2026-12-06 07:05 UTC)" in s and s.startswith("**Declared before the runs.**")
    late = declaration_sentence([_rec(T + timedelta(minutes=20))], times, ["a", "b"])
    assert "after 2 of the 2 runs had finished" in late and "before the runs" not in late
    assert declaration_sentence([], times, ["a", "b"]) == NO_RECORD
    assert "not recorded" in declaration_sentence([_rec(T)], {}, ["a", "b"])


def test_margins_changed_after_a_look_are_said_to_be():
    times = {"a": {"start": (T + timedelta(minutes=5)).isoformat(), "end": (T + timedelta(minutes=15)).isoformat()}}
    recs = [_rec(T, id_="r1"), _rec(T + timedelta(minutes=30), margins={"m": 1.0}, id_="r2")]
    f = declaration_facts(recs, times, ["a"])
    assert f["family"]["id"] == "r1" and f["margins"]["id"] == "r2" and f["margins"]["finished_before"] == 1
    s = declaration_sentence(recs, times, ["a"])
    assert "before the first run started" in s and "margins were last changed at 2026-12-06 07:30 UTC, after 1 of the 1 runs had finished" in s
    assert not s.startswith("**Declared before the runs.**")
