"""The container must carry everything the server imports: checked against the code, so they cannot drift."""

import ast
import importlib.metadata
import re
import sys

from helpers import ROOT

SERVER_FILES = ["env_server.py", "actions.py"]


def imported_top_level_modules(path) -> set[str]:
    modules = set()
    for node in ast.walk(ast.parse((ROOT / path).read_text())):
        if isinstance(node, ast.Import):
            modules |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            modules.add(node.module.split(".")[0])
    return modules


def test_dockerfile_copies_the_server_and_every_local_module_it_imports():
    dockerfile = (ROOT / "Dockerfile").read_text()
    copied = set(re.search(r"^COPY (.+) \./$", dockerfile, re.M).group(1).split())
    local = {f"{m}.py" for f in SERVER_FILES for m in imported_top_level_modules(f) if (ROOT / f"{m}.py").exists()}
    assert set(SERVER_FILES) | local <= copied


def test_dockerfile_installs_the_distribution_of_every_third_party_import():
    dockerfile = (ROOT / "Dockerfile").read_text().lower()
    installed = set(re.findall(r'"([a-z0-9_.-]+)(?:[<>=!~][^"]*)?"', dockerfile))
    providers = importlib.metadata.packages_distributions()
    third_party = {
        m for f in SERVER_FILES for m in imported_top_level_modules(f)
        if m not in sys.stdlib_module_names and not (ROOT / f"{m}.py").exists()
    }  # fmt: skip
    for module in third_party:
        distributions = {d.lower() for d in providers[module]}
        assert distributions & installed, f"{module} (from {distributions}) is not installed by the Dockerfile"
