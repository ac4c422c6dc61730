"""The files' dependencies run one way: the wire contract is a leaf, and nothing that trains, evaluates or talks
to a server loads the server (its browser pool, its Playwright patch, its app)."""

import subprocess
import sys
import tomllib

from helpers import ROOT, local_modules


def test_the_wire_contract_imports_nothing_of_the_project():
    assert local_modules("env_protocol.py") == set()


def test_importing_the_trainer_client_evaluation_or_cloud_boundary_loads_no_browser_code():
    # One interpreter for all of them: a module that loaded browser code would load it beside the others too.
    code = "import sys, train, evaluate, env_client, rollout, modal_app; "
    code += "print(sorted({'env_server', 'miniwob_env', 'browser_setup'} & set(sys.modules)))"
    loaded = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert loaded == "[]\n"


def test_every_top_level_module_is_installed_so_that_bench_scripts_import_it():
    # bench/ scripts run with bench/ first on sys.path: they find the project's modules only as installed.
    installed = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["py-modules"]
    assert sorted(installed) == sorted(path.stem for path in ROOT.glob("*.py"))
