"""docs/gpu-recipe.md says which vLLM and torch ctu supports as pyproject.toml declares them (the ``vllm`` extra and
the torch dependency), and names both recipe presets; a version bump in one place without the other fails here."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "gpu-recipe.md"


def declared() -> dict[str, str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    deps = [*project["dependencies"], *project["optional-dependencies"]["vllm"]]
    return {re.split(r"[<>=!~ ;\[]", d, maxsplit=1)[0]: d.split(";")[0].strip() for d in deps}


def test_the_page_quotes_the_declared_vllm_and_torch_requirements():
    page, deps = PAGE.read_text(encoding="utf-8"), declared()
    for name in ("vllm", "torch"):
        assert f"`{deps[name]}`" in page, f"docs/gpu-recipe.md does not say `{deps[name]}` (pyproject.toml)"
    stated = set(re.findall(r"`(vllm[<>=!~][^`]*)`", page))
    assert stated == {deps["vllm"]}, f"docs/gpu-recipe.md states vLLM requirements {stated}, pyproject {deps['vllm']}"


def test_the_page_runs_both_recipe_presets():
    page = PAGE.read_text(encoding="utf-8")
    presets = sorted(p.name for p in (ROOT / "configs").glob("qwen3-4b-instruct-2507-*.yaml"))
    assert len(presets) == 2 and all(f"ctu train configs/{p}" in page for p in presets)
