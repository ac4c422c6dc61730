"""Where each part runs, held by rules rather than lists: the environment package installs and runs on its own (what
its container does), its wire types are a leaf, and nothing that trains, evaluates, records or launches loads the
environment's server (its browsers, its Playwright patch, its app), whose modules each do one job."""

import ast
import os
import re
import shutil
import subprocess
import sys
import tomllib

import yaml

from helpers import ROOT, imported_modules, local_modules, third_party_distributions

ENVIRONMENT = ROOT / "web_env"
PRODUCT_PACKAGES = ("browser_rl", "warm_start", "web_env", "workflows")


def product_modules() -> list[str]:
    """Every module of the recipe, its commands and its offline tooling: the top level's and its packages' but the
    environment's."""
    top = [path.stem for path in ROOT.glob("*.py")]
    packages = [
        ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        for package in ("browser_rl", "warm_start")
        for path in sorted((ROOT / package).rglob("*.py"))
        if path.name != "__main__.py"
    ]
    return top + packages


def test_the_wire_contract_imports_nothing_of_the_project():
    assert local_modules("web_env/models.py") == set()


def test_the_client_imports_only_openenv_the_wire_types_and_the_standard_library():
    # As OpenEnv's own clients: a user's loop that plays on the server needs nothing of the recipe.
    tree = ast.parse((ROOT / "env_client.py").read_text())
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    allowed = {m for m in imported if m.split(".")[0] in sys.stdlib_module_names or m.split(".")[0] == "openenv"}
    assert imported - allowed == {"web_env", "web_env.models"}  # the package first, for how it imports OpenEnv


def test_the_recipe_installed_as_a_package_runs_the_workflows_config_from_a_users_folder(tmp_path):
    """A non-editable install (pip install .), and a folder holding the workflows and their config as a user copies
    them: the config names its task modules, which the installed package loads from that folder."""
    source, installed, users = tmp_path / "source", tmp_path / "site", tmp_path / "project"
    source.mkdir()
    for part in ("pyproject.toml", "README.md", "env_client.py", "rewards.py"):
        shutil.copy(ROOT / part, source / part)
    for package in ("browser_rl", "web_env", "warm_start"):
        shutil.copytree(ROOT / package, source / package, ignore=shutil.ignore_patterns("__pycache__"))
    command = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation", "--target"]
    subprocess.run([*command, str(installed), str(source)], check=True, capture_output=True)
    shutil.copytree(ROOT / "workflows", users / "workflows", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "configs", users / "configs")
    code = (
        "import browser_rl; from browser_rl.command_line import parse_command_line; "
        "from browser_rl.options import TaskArguments; "
        "(tasks,) = parse_command_line([TaskArguments], ['--config', 'configs/workflows.yaml']); "
        "print(browser_rl.__file__); print(sorted(tasks.task_weights()))"
    )
    path = os.pathsep.join([str(installed), *(p for p in sys.path if p and ROOT.as_posix() not in p)])
    run = subprocess.run(
        [sys.executable, "-P", "-c", code],
        cwd=users,
        env={**os.environ, "PYTHONPATH": path},
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    where, tasks = run.stdout.splitlines()
    assert where.startswith(str(installed)) and tasks == "['book-clinic', 'pay-bills', 'shop-checkout']"


def modules_loaded(imports, watched) -> list[str]:
    """The modules of the packages `watched` that importing `imports` loads, in one fresh interpreter: a module that
    loaded one of them would load it beside the others too."""
    code = f"import importlib, sys; [importlib.import_module(m) for m in {list(imports)!r}]; "
    code += f"print(sorted(m for m in sys.modules if any(m == w or m.startswith(w + '.') for w in {list(watched)!r})))"
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-3000:]
    return ast.literal_eval(run.stdout)


def test_nothing_that_trains_evaluates_records_or_launches_loads_the_environment_server():
    assert modules_loaded(product_modules(), ["web_env.server"]) == []


def test_what_samples_without_a_trainer_loads_neither_vllm_nor_trls_trainer():
    # TRL's trainer module imports vLLM wherever it is installed: about 4 s more at every start of these commands,
    # for nothing they use (docs/test_suite.md).
    commands = ["evaluate", "run_agent", "warm_start.record"]
    assert modules_loaded(commands, ["vllm", "trl.trainer.grpo_trainer"]) == []


def test_the_environment_package_installs_alone_and_its_server_runs_from_the_installed_copy(tmp_path):
    """What its container does: the folder installed (its own pyproject.toml), then run from anywhere."""
    installed, source = tmp_path / "site", tmp_path / "web_env"
    shutil.copytree(ENVIRONMENT, source, ignore=shutil.ignore_patterns("__pycache__"))  # pip builds in the folder
    command = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(installed)]
    subprocess.run([*command, str(source)], check=True, capture_output=True)
    assert sorted(p.name for p in (installed / "web_env/server/scripts").glob("*.js")) == sorted(
        p.name for p in (ENVIRONMENT / "server/scripts").glob("*.js")
    )
    # The installed copy alone on the path (besides the dependencies), away from the project's folder.
    path = os.pathsep.join([str(installed), *(p for p in sys.path if p and ROOT.as_posix() not in p)])
    run = subprocess.run(
        [sys.executable, "-P", "-m", "web_env.server", "--help"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": path},
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert "--max_sessions" in run.stdout
    imported = subprocess.run(
        [sys.executable, "-P", "-c", "import web_env.server.app as app; print(app.__file__)"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": path},
        capture_output=True,
        text=True,
    )
    assert imported.stdout.startswith(str(installed)), imported.stderr[-3000:]


def requirement_names(requirements: list[str]) -> set[str]:
    return {re.split(r"[<>=!~\[ ;]", requirement)[0].lower() for requirement in requirements}


def test_the_environment_package_declares_every_distribution_it_imports_and_the_recipe_installs_them():
    declared = tomllib.loads((ENVIRONMENT / "pyproject.toml").read_text())["project"]["dependencies"]
    files = [str(path.relative_to(ROOT)) for path in ENVIRONMENT.rglob("*.py")]
    for module, distributions in third_party_distributions(*files).items():
        assert distributions & requirement_names(declared), f"{module} ({distributions}) is not in web_env's pyproject"
    recipe = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert set(declared) <= set(recipe)  # a local run starts the same server from the recipe's environment


def test_each_module_of_the_product_reads_in_one_sitting():
    # Each module does one job (the server's session, browsers and actions; the rollout's loop and its episodes'
    # tokens; an evaluation's play and its report): a module past 400 lines is doing a second job that wants its own.
    files = [*ROOT.glob("*.py"), *(path for package in PRODUCT_PACKAGES for path in (ROOT / package).rglob("*.py"))]
    lengths = {str(path.relative_to(ROOT)): len(path.read_text().splitlines()) for path in files}
    assert len(lengths) > 50 and "web_env/server/environment.py" in lengths
    assert {name: n for name, n in lengths.items() if n > 400} == {}


def test_the_openenv_manifest_passes_openenvs_validator_and_says_what_the_package_is():
    from openenv.validation.parsers.openenv_yaml import OpenEnvYamlParser

    from browser_rl.command_options import ModalArguments
    from web_env import models

    manifest = OpenEnvYamlParser().parse(ENVIRONMENT)  # OpenEnv's own reading of it, schema checked
    raw = yaml.safe_load((ENVIRONMENT / "openenv.yaml").read_text())
    package = tomllib.loads((ENVIRONMENT / "pyproject.toml").read_text())["project"]
    assert (manifest.name, manifest.version) == (package["name"], package["version"])
    assert isinstance(getattr(models, raw["action"]), type) and isinstance(getattr(models, raw["observation"]), type)
    dockerfile = (ENVIRONMENT / "server" / "Dockerfile").read_text()
    assert f"EXPOSE {raw['port']}\n" in dockerfile and f'"--port", "{raw["port"]}"' in dockerfile
    assert manifest.reward.range == (0.0, 1.0) and manifest.network.mode == "no-network"
    sizing = ModalArguments()  # what the recipe gives one server where it starts them in containers
    assert (manifest.resources.cpu, manifest.resources.memory_mb) == (sizing.modal_env_cpu, sizing.modal_env_memory_mb)


def test_the_bench_index_lists_every_script_and_each_page_it_names_quotes_it():
    rows = re.findall(r"^\| `([a-z_0-9]+\.py)` \| [^|]+ \| ([^|]+) \|$", (ROOT / "bench/README.md").read_text(), re.M)
    assert sorted(name for name, _ in rows) == sorted(path.name for path in (ROOT / "bench").glob("*.py"))
    for name, pages in rows:
        for page in pages.split(", "):
            assert f"bench/{name}" in (ROOT / page.strip()).read_text(), (name, page)


def test_no_test_imports_a_benchmark():
    # bench/ holds scripts, run as commands; what a test and a benchmark both use lives in tests/ or a package.
    tests = sorted((ROOT / "tests").rglob("*.py"))
    assert [p.name for p in tests if "bench" in imported_modules(str(p.relative_to(ROOT)))] == []


def test_the_readmes_results_table_is_the_one_its_script_makes_from_the_evaluations():
    # One source for the figures: the evaluations kept in docs/results/, read by bench/results.py.
    made = subprocess.run(
        [sys.executable, "bench/results.py", "--table"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.strip()
    readme = (ROOT / "README.md").read_text()
    shown = readme.split("<!-- results table: python bench/results.py -->\n")[1].split("\n<!-- end of results table")[0]
    assert shown == made
    assert len(made.splitlines()) <= 2 + 8  # at most 8 rows
    # What the prose under the table says of these rows, it says in words: their figures are the table's alone. A
    # figure of its own names the command that makes it.
    prose = readme.split("<!-- end of results table -->")[1].split("\n## ")[0]
    assert not re.search(r"p = |\bpoints\b|\d+ → \d+ of", prose), prose
    for sentence in re.split(r"(?<=\.) ", prose.replace("\n", " ")):
        assert not re.search(r"\d%", sentence) or "`python " in sentence, sentence


def test_the_readme_reads_in_five_minutes_and_says_first_what_the_recipe_achieves():
    readme = (ROOT / "README.md").read_text()
    headings = re.findall(r"^## (.+)$", readme, re.M)
    assert len(readme.splitlines()) <= 250
    assert headings[:3] == ["What it achieves", "Quick start, on a CPU", "On a GPU"]
    assert "Q4_1" in readme.split("## Quick start")[0]  # the real model is a dequantized 4-bit file, and says so


def test_each_product_modules_docstring_says_its_job_in_a_dozen_lines_the_why_in_the_docs():
    files = [*ROOT.glob("*.py"), *(path for package in PRODUCT_PACKAGES for path in (ROOT / package).rglob("*.py"))]
    lengths = {}
    for path in files:
        docstring = ast.get_docstring(ast.parse(path.read_text()), clean=False)
        lengths[str(path.relative_to(ROOT))] = len(docstring.splitlines()) if docstring else 0
    assert len(lengths) > 50 and {name: n for name, n in lengths.items() if n > 12} == {}
