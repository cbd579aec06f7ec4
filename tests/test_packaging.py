"""The distribution: every source folder is packaged, the carrier's extra stays lean."""

from __future__ import annotations

from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def _source_packages() -> set[str]:
    mapping = PYPROJECT["tool"]["setuptools"]["package-dir"]
    found = set()
    for package, folder in mapping.items():
        base = ROOT / folder
        for directory in [base, *[p for p in base.rglob("*") if p.is_dir() and not p.is_symlink()]]:
            if "__pycache__" in directory.parts or not any(directory.glob("*.py")):
                continue
            rel = directory.relative_to(base).parts
            found.add(".".join((package, *rel)))
    return found


def test_every_folder_with_python_files_is_a_listed_package() -> None:
    listed = set(PYPROJECT["tool"]["setuptools"]["packages"])
    missing = _source_packages() - listed
    assert not missing, f"add these to [tool.setuptools] packages in pyproject.toml: {sorted(missing)}"


def test_probe_extra_has_no_control_plane_dependencies() -> None:
    probe = " ".join(PYPROJECT["project"]["optional-dependencies"]["probe"]).lower()
    for heavy in ("kopf", "pykube", "kubernetes", "alibabacloud-ecs", "prometheus"):
        assert heavy not in probe, f"{heavy} must not be installed on carriers"


def test_no_top_level_operator_module_shadows_the_standard_library() -> None:
    assert not (ROOT / "operator" / "__init__.py").exists()
    assert (ROOT / "csbench" / "operator").resolve() == (ROOT / "operator").resolve()
