"""The files' dependencies run one way: the wire contract is a leaf, and nothing that trains, evaluates or talks
to a server loads the server (its browser pool, its Playwright patch, its app)."""

import subprocess
import sys
import tomllib

import pytest

from helpers import ROOT, local_modules


def test_the_wire_contract_imports_nothing_of_the_project():
    assert local_modules("env_protocol.py") == set()


@pytest.mark.parametrize("modules", ["train, evaluate", "env_client", "rollout", "modal_app"])
def test_importing_the_trainer_client_or_evaluation_does_not_load_the_server(modules):
    code = f"import sys, {modules}; print('env_server' in sys.modules)"
    loaded = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert loaded == "False\n"


def test_every_top_level_module_is_installed_so_that_bench_scripts_import_it():
    # bench/ scripts run with bench/ first on sys.path: they find the project's modules only as installed.
    installed = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["py-modules"]
    assert sorted(installed) == sorted(path.stem for path in ROOT.glob("*.py"))
