"""Fuzzing the two files a user writes: experiment YAML (dapo.config) and sweep specs
(dapo.sweep.spec). Whatever the file holds — a valid config with random mutations (wrong
types, out-of-range or non-finite numbers, deleted / unknown / misspelt keys, junk in lists),
broken YAML, or junk ``KEY=VALUE`` overrides — loading either succeeds or raises
:class:`dapo.config.ConfigError` naming the file (and, for a wrong type or an unknown key,
the dotted key). Any other exception is a bug.
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import math
import os
import re
import tempfile
from datetime import timedelta
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from dapo.config import ConfigError, field_docs, load_config, read_yaml

REPO = Path(__file__).resolve().parents[1]
EXPERIMENTS = sorted((REPO / "experiments").glob("*.yaml"))
SWEEPS = sorted((REPO / "sweeps").glob("*.yaml"))
LEAVES = {k for k, _, _ in field_docs()}
SECTIONS = {k.rsplit(".", i)[0] for k in LEAVES for i in range(1, k.count(".") + 1)}
KNOWN = LEAVES | SECTIONS
SETTINGS = settings(max_examples=150, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

# --------------------------------------------------------------------------- strategies
scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-10**12, 10**12), st.sampled_from([0, -1, 1, 2**63, -2**63]),
    st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([0.0, -0.0, 1e-300, -1e300, 0.5, 1.5]),
    st.text(max_size=12), st.sampled_from(["", " ", "null", "true", "1e3", "[", "{a: 1}", "x" * 300,
                                           "ünïcødé ✓", "\x00", "a\nb", "${HOME}", "$(rm -rf /)"]))
junk = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                     st.dictionaries(st.one_of(st.text(max_size=8), st.integers()),
                                                                     inner, max_size=3)), max_leaves=6)


class Idx(int):
    """A list index in a path (a plain int in a path is a mapping key)."""


def _paths(node, prefix=()):
    """Every (path, value) in a nested dict/list; a path is a tuple of keys and list indices."""
    yield prefix, node
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _paths(v, prefix + (Idx(i),))


def _dotted(path) -> str:
    out = ""
    for p in path:
        out += f"[{p}]" if isinstance(p, Idx) else (f".{p}" if out else str(p))
    return out


def _mutate(data, draw, n_max=3):
    """Apply 1..n_max random mutations to a deep copy of ``data``; returns (data, [(op, path)])."""
    data = copy.deepcopy(data)
    done = []
    for _ in range(draw(st.integers(1, n_max))):
        paths = [p for p, _ in _paths(data) if p]
        path = draw(st.sampled_from(paths))
        parent = data
        for p in path[:-1]:
            parent = parent[p]
        key = path[-1]
        op = draw(st.sampled_from(["replace", "replace", "delete", "add", "typo"]))
        if op == "replace":
            parent[key] = draw(junk)
        elif op == "delete":
            if isinstance(parent, list):
                parent.pop(key)
            else:
                del parent[key]
        elif op == "add" and isinstance(parent, dict):
            new = draw(st.one_of(st.text(min_size=1, max_size=10), st.integers()))
            assume(new not in parent)
            parent[new] = draw(junk)
            path = path[:-1] + (new,)
        elif op == "typo" and isinstance(parent, dict) and isinstance(key, str):
            new = key + draw(st.sampled_from(["s", "_", "x"])) if draw(st.booleans()) else key[:-1]
            assume(new and new not in parent)
            parent[new] = parent.pop(key)
            path = path[:-1] + (new,)
        else:
            parent[key] = draw(junk)
            op = "replace"
        done.append((op, path))
    return data, done


def _write(tmp: Path, name: str, data) -> Path:
    path = tmp / name
    path.write_text(yaml.safe_dump(data, allow_unicode=True, sort_keys=False))
    return path


def _check_error(exc: ConfigError, path: Path, mutations=()):
    msg = str(exc)
    assert str(path) in msg, msg
    assert any(re.search(rf"(?<![\w.]){re.escape(k)}(?![\w])", msg) for k in KNOWN) or "top level" in msg \
        or "unknown key" in msg, f"no key named: {msg}"
    if len(mutations) == 1 and ("expected" in msg or "unknown key" in msg):
        op, p = mutations[0]
        names = {_dotted(p), repr(_dotted(p))[1:-1]}          # the key, as written or escaped by repr
        assert any(n in msg for n in names), (mutations, msg)


# --------------------------------------------------------------------------- experiments
@pytest.fixture(scope="module")
def tmpdir():
    with tempfile.TemporaryDirectory() as d:
        yield Path(d)


def test_every_shipped_experiment_loads():
    for p in EXPERIMENTS:
        load_config(p)


@SETTINGS
@given(data=st.data())
def test_mutated_experiment_raises_only_config_error_naming_file_and_key(tmpdir, data):
    src = data.draw(st.sampled_from(EXPERIMENTS))
    base = read_yaml(src)                      # inherit resolved: a complete, valid experiment
    mutated, muts = _mutate(base, data.draw)
    path = _write(tmpdir, "exp.yaml", mutated)
    try:
        load_config(path)
    except ConfigError as exc:
        _check_error(exc, path, muts)


@SETTINGS
@given(data=st.data())
def test_one_mutation_names_exactly_that_key(tmpdir, data):
    base = read_yaml(data.draw(st.sampled_from(EXPERIMENTS)))
    mutated, muts = _mutate(base, data.draw, n_max=1)
    path = _write(tmpdir, "one.yaml", mutated)
    try:
        load_config(path)
    except ConfigError as exc:
        _check_error(exc, path, muts)


@SETTINGS
@given(data=st.data())
def test_broken_yaml_text_raises_only_config_error(tmpdir, data):
    text = (REPO / "experiments" / "tiny-dapo.yaml").read_text()
    how = data.draw(st.sampled_from(["cut", "insert", "random"]))
    if how == "cut":
        i = data.draw(st.integers(0, len(text)))
        j = data.draw(st.integers(i, min(len(text), i + 200)))
        text = text[:i] + text[j:]
    elif how == "insert":
        i = data.draw(st.integers(0, len(text)))
        text = text[:i] + data.draw(st.text(alphabet=list(":{}[]-,&*!|>'\"%@`#\t\n ?"), max_size=20)
                                    | st.text(max_size=20)) + text[i:]
    else:
        text = data.draw(st.text(max_size=200))
    path = tmpdir / "broken.yaml"
    path.write_text(text, encoding="utf-8")
    try:
        load_config(path)
    except ConfigError as exc:
        assert str(path) in str(exc)


@SETTINGS
@given(items=st.lists(st.one_of(
    st.builds(lambda k, v: f"{k}={v}", st.sampled_from(sorted(LEAVES)), st.text(max_size=15)),
    st.builds(lambda k, v: f"{k}={v}", st.sampled_from(sorted(SECTIONS)), st.text(max_size=15)),
    st.text(max_size=25)), min_size=1, max_size=3))
def test_junk_overrides_raise_only_config_error(items):
    try:
        load_config(REPO / "experiments" / "tiny-dapo.yaml", items)
    except ConfigError as exc:
        assert "tiny-dapo.yaml" in str(exc) or "override" in str(exc), str(exc)


def test_each_wrong_type_names_the_key_and_the_allowed_values(tmp_path):
    for key, value, words in [("train.lr", "fast", "expected float"), ("rollout.engine", "sglang", "one of 'vllm', 'hf'"),
                              ("algo.clip", 0.2, "expected mapping"), ("eval.datasets", {"name": "x"}, "expected list"),
                              ("train.betas", [0.9], "of length 2"), ("algo.clip.eps_hi", 0.3, "unknown key")]:
        data = read_yaml(REPO / "experiments" / "tiny-dapo.yaml")
        node = data
        *parents, leaf = key.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
        path = _write(tmp_path, "e.yaml", data)
        with pytest.raises(ConfigError) as err:
            load_config(path)
        assert str(path) in str(err.value) and key in str(err.value) and words in str(err.value), str(err.value)


# Gaps the fuzzing found in dapo/config/ and dapo/sweep/spec.py, fixed; kept as regressions.
def test_non_utf8_experiment_is_a_config_error(tmp_path):
    path = tmp_path / "latin1.yaml"
    path.write_bytes("name: caf\xe9\n".encode("latin-1"))
    with pytest.raises(ConfigError, match=re.escape(str(path))):
        load_config(path)


def test_deeply_nested_yaml_is_a_config_error(tmp_path):
    path = tmp_path / "deep.yaml"
    path.write_text("[" * 5000)
    with pytest.raises(ConfigError, match=re.escape(str(path))):
        load_config(path)


@pytest.mark.parametrize("key", ["train.lr", "train.grad_clip", "algo.clip.eps_high", "train.weight_decay"])
def test_non_finite_numbers_are_refused(tmp_path, key):
    data = read_yaml(REPO / "experiments" / "tiny-dapo.yaml")
    section, leaf = key.rsplit(".", 1)
    node = data
    for p in section.split("."):
        node = node.setdefault(p, {})
    node[leaf] = math.inf
    path = _write(tmp_path, "inf.yaml", data)
    with pytest.raises(ConfigError, match=re.escape(key)):
        load_config(path)


# --------------------------------------------------------------------------- sweep specs
def _spec_loader():
    from dapo.sweep.spec import load_spec
    return load_spec


@SETTINGS
@given(data=st.data())
def test_mutated_sweep_spec_raises_only_config_error_naming_the_file(tmpdir, data):
    load_spec = _spec_loader()
    src = data.draw(st.sampled_from([p for p in SWEEPS if "mini" in p.name or "smoke" in p.name]))
    base = yaml.safe_load(src.read_text())
    mutated, muts = _mutate(base, data.draw)
    path = _write(tmpdir, "spec.yaml", mutated)
    try:
        load_spec(path)
    except ConfigError as exc:
        assert str(path) in str(exc), (muts, str(exc))


@SETTINGS
@given(text=st.text(max_size=300))
def test_broken_sweep_spec_text_raises_only_config_error(tmpdir, text):
    load_spec = _spec_loader()
    path = tmpdir / "junk-spec.yaml"
    path.write_text(text, encoding="utf-8")
    try:
        load_spec(path)
    except ConfigError as exc:
        assert str(path) in str(exc)


# Regressions: the two crashes this fuzzing found in dapo/sweep/spec.py (keys mixing int and str).
def test_technique_with_mixed_type_keys_is_a_config_error(tmp_path):
    load_spec = _spec_loader()
    spec = yaml.safe_load((REPO / "sweeps" / "smoke-slurm.yaml").read_text())
    spec["techniques"][0] = {1: None, "x": None}
    path = _write(tmp_path, "mixed.yaml", spec)
    with pytest.raises(ConfigError, match=re.escape(str(path))):
        load_spec(path)


def test_grid_value_with_mixed_type_keys_is_a_config_error(tmp_path):
    load_spec = _spec_loader()
    spec = yaml.safe_load((REPO / "sweeps" / "clip-higher-eps-mini.yaml").read_text())
    key = next(iter(spec["grid"]))
    spec["grid"][key] = [{"": None, 0: None}, 0.2]
    path = _write(tmp_path, "mixed-grid.yaml", spec)
    with pytest.raises(ConfigError, match=re.escape(str(path))):
        load_spec(path)


@pytest.mark.parametrize("content", [b"name: caf\xe9\n", b"[" * 5000], ids=["latin-1", "deep"])
def test_unreadable_sweep_spec_is_a_config_error(tmp_path, content):
    load_spec = _spec_loader()
    path = tmp_path / "spec.yaml"
    path.write_bytes(content)
    with pytest.raises(ConfigError, match=re.escape(str(path))):
        load_spec(path)


# --------------------------------------------------------------------------- the CLI, end to end (issue 27)
# What a user sees: every input below goes through ``dapo config`` / ``dapo train`` (to its preflight, with a
# fake trainer) / ``dapo sweep expand`` in-process; each ends with exit 0, or exit 2 and exactly one
# ``error:`` line, never a traceback, and a refused ``dapo train`` writes nothing. Each case has a deadline
# (20 s: a case takes ~0.1 s, but this machine's cores are shared; a parse that took 105 s still fails it).
# FUZZ_N=400 runs more cases (the default 20 per test keeps the file under ~20 s).
CLI = settings(max_examples=int(os.environ.get("FUZZ_N", "20")), deadline=timedelta(seconds=20), derandomize=True,
               suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                      HealthCheck.function_scoped_fixture])
SMOKE = REPO / "experiments" / "tiny-random-smoke.yaml"
ROWS = '{"prompt": "1+1", "answer": "2"}\n' * 8
NOT_FUZZED = {"output_dir", "logging.tracking_uri", "model.path"}   # a store / the hub: their own tests


def _cli(fn, argv) -> tuple[int, str]:
    """``fn(argv)`` with stdout and stderr captured; (exit status, stderr). An exception escapes: a bug."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = fn(argv)
    return rc, err.getvalue()


def _ok_or_one_error(rc: int, err: str) -> None:
    assert "Traceback" not in err, err
    if rc == 2:
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ") and len(lines[0]) < 1500, err
    else:
        assert rc == 0, (rc, err)


def _yaml_value(v) -> str:
    """A Python value as the text of a KEY=VALUE override (flow YAML, one line)."""
    try:
        return yaml.safe_dump(v, default_flow_style=True, width=10**9, allow_unicode=True).strip().removesuffix("...").strip()
    except yaml.YAMLError:
        return str(v)


override_items = st.lists(st.tuples(
    st.one_of(st.sampled_from(sorted(LEAVES - NOT_FUZZED)), st.sampled_from(sorted(SECTIONS)),
              st.text(alphabet="abcdefghijklmnop._", min_size=1, max_size=12)),
    st.one_of(junk.map(_yaml_value), st.text(max_size=20))), max_size=3, unique_by=lambda kv: kv[0])


@CLI
@given(items=override_items)
def test_cli_config_with_junk_overrides_is_ok_or_one_error_line(items):
    from dapo.cli import main
    rc, err = _cli(main, ["config", str(SMOKE), *(f"{k}={v}" for k, v in items)])
    _ok_or_one_error(rc, err)


@pytest.fixture(scope="module")
def small_rows(tmpdir):
    """A good data file; first one ``dapo train`` preflight of each reader, so that no case's deadline
    pays for the first import of pyarrow, pandas or the config layer."""
    from dapo.cli import train_main
    path = tmpdir / "rows.jsonl"
    path.write_text(ROWS)
    import pandas as pd
    pd.DataFrame({"prompt": ["1+1"] * 8, "answer": ["2"] * 8}).to_parquet(tmpdir / "rows.parquet")
    (tmpdir / "rows.json").write_text(json.dumps([{"prompt": "1+1", "answer": "2"}] * 8))
    for name in ("rows.jsonl", "rows.parquet", "rows.json"):
        rc, err = _cli(lambda a: train_main(a, train_fn=lambda cfg, d: {}),
                       [str(SMOKE), f"data.train={tmpdir / name}", f"output_dir={tmpdir / 'warm-out'}"])
        assert rc == 0, err
    return path


@CLI
@given(items=override_items)
def test_cli_train_preflight_with_junk_overrides_is_ok_or_one_error_line_and_writes_nothing(tmpdir, small_rows,
                                                                                           items):
    import shutil

    from dapo.cli import train_main
    out = tmpdir / "train-out"
    shutil.rmtree(out, ignore_errors=True)
    calls = []
    argv = [str(SMOKE), f"data.train={small_rows}", *(f"{k}={v}" for k, v in items if k != "data.train"),
            f"output_dir={out}"]
    rc, err = _cli(lambda a: train_main(a, train_fn=lambda cfg, d: calls.append(d) or {}), argv)
    _ok_or_one_error(rc, err)
    assert (rc == 0) == bool(calls)
    if rc == 2:
        assert not out.exists()


def _rows_text(draw) -> bytes:
    """The bytes of a data file: JSON rows with junk fields, broken lines, stray bytes."""
    row = st.one_of(
        st.fixed_dictionaries({"prompt": junk, "answer": junk}),
        st.dictionaries(st.sampled_from(["prompt", "problem", "question", "answer", "ground_truth", "x"]), junk,
                        max_size=3),
        junk)
    lines = draw(st.lists(st.one_of(row.map(lambda r: json.dumps(r, default=str)), st.text(max_size=30),
                                    st.binary(max_size=20).map(lambda b: b.decode("latin-1"))), max_size=12))
    text = "\n".join(lines).encode("utf-8", "surrogatepass")
    return draw(st.one_of(st.just(text), st.binary(max_size=200)))


@CLI
@given(data=st.data())
def test_cli_train_with_a_junk_data_file_is_ok_or_one_error_line(tmpdir, small_rows, data):
    from dapo.cli import train_main
    suffix = data.draw(st.sampled_from([".jsonl", ".json", ".parquet"]))
    path = tmpdir / f"junk{suffix}"
    path.write_bytes(_rows_text(data.draw))
    key = data.draw(st.sampled_from(["data.train", "eval.datasets"]))
    value = str(path) if key == "data.train" else f"[{{name: {path}}}]"
    on_bad = data.draw(st.sampled_from(["drop", "fail"]))
    out = tmpdir / "data-out"
    rc, err = _cli(lambda a: train_main(a, train_fn=lambda cfg, d: {}),
                   [str(SMOKE), f"{key}={value}", f"data.on_bad={on_bad}", f"output_dir={out}"])
    _ok_or_one_error(rc, err)
    if rc == 2:
        assert not out.exists()


@CLI
@given(data=st.data())
def test_cli_sweep_expand_of_a_mutated_spec_is_ok_or_one_error_line(tmpdir, data):
    from dapo.cli import main
    base = {"name": "s", "base": str(SMOKE), "kind": "ladder", "base_overrides": {"rollout.engine": "hf"},
            "baseline": {"name": "grpo", "overrides": {"algo.clip.eps_high": 0.2}},
            "techniques": [{"name": "clip_higher", "overrides": {"algo.clip.eps_high": 0.28}}],
            "seeds": [0, 1], "metric": "eval/arith-eval/avg_at_2", "final_k": 1}
    mutated, _ = _mutate(base, data.draw)
    path = _write(tmpdir, "cli-spec.yaml", mutated)
    rc, err = _cli(main, ["sweep", "expand", str(path), "--output", str(tmpdir / "sweep-out")])
    _ok_or_one_error(rc, err)


def test_a_huge_yaml_file_and_a_huge_grid_are_refused_at_once(tmp_path):
    """Unbounded before: a 50 MB experiment took 105 s to parse, a 10 000-point grid minutes to expand."""
    from dapo.cli import main
    from dapo.sweep.spec import MAX_SWEEP_JOBS
    from dapo.yaml_io import MAX_YAML_BYTES
    big = tmp_path / "big.yaml"
    big.write_text("a:\n" + "  - x\n" * (MAX_YAML_BYTES // 6 + 10))
    rc, err = _cli(main, ["config", str(big)])
    _ok_or_one_error(rc, err)
    assert rc == 2 and "more than the 1024 KiB" in err
    grid = {"name": "g", "base": str(SMOKE), "kind": "grid", "seeds": [0], "metric": "eval/arith-eval/avg_at_2",
            "grid": {"train.lr": [1e-6 * (i + 1) for i in range(100)],
                     "algo.clip.eps_high": [0.2 + i / 1000 for i in range(100)]}}
    rc, err = _cli(main, ["sweep", "expand", str(_write(tmp_path, "g.yaml", grid))])
    _ok_or_one_error(rc, err)
    assert rc == 2 and f"10000 runs, more than the {MAX_SWEEP_JOBS}" in err
