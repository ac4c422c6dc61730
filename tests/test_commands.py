"""Every command README.md and docs/ show runs as written: the files, configs and make targets it names exist, and
(slow tier) every entry point it runs answers --help; a `python -c` one-liner runs."""

import json
import re
import shlex
import subprocess
import sys

import modal
import pytest
import yaml

import modal_app
from helpers import ROOT

DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
RUNNERS = ("python", "torchrun", "accelerate", "make", "modal", "docker")
# Paths a command may name that a run makes (outputs, the built models and the demonstrations it records) or that
# stand for the reader's own (my.yaml, the tutorial's coffee/ folder).
MADE_BY_A_RUN = ("outputs/", ".cache/", "my.yaml", "coffee/")
# Experiments' scripts that their documents say were removed once they had answered, each at the commit the document
# names for it (docs/page-reading-experiments.md).
REMOVED = {"bench/reading.py", "bench/lora_ceiling.py"}


def shown_commands() -> list[tuple[str, str]]:
    """(document, command) for every command line of a ```bash block, continuation lines joined, and every inline
    `python ...` (and the other runners') span."""
    commands = []
    for document in DOCUMENTS:
        text = document.read_text()
        for block in re.findall(r"^```(?:bash|sh)\n(.*?)^```", text, re.S | re.M):
            for line in block.replace("\\\n", " ").splitlines():
                line = line.split("  #")[0].strip()
                if line.split(" ")[0] in RUNNERS:
                    commands.append((document.name, line))
        for span in re.findall(r"(?<!``)`((?:python|torchrun|accelerate launch|make|modal run|docker) [^`]+)`", text):
            commands.append((document.name, span))
    return commands


COMMANDS = shown_commands()


def words(command: str) -> list[str]:
    """The command's words, optional parts ([--split test]) and placeholders left out."""
    return [w for w in shlex.split(re.sub(r"\[[^]]*\]", "", command)) if "<" not in w and not w.startswith("$")]


def named_paths(command: str) -> list[str]:
    """The files and folders of the project a command names."""
    paths = []
    for word in words(command):
        candidate = word.split("=")[-1]
        looks_like_a_path = candidate.endswith((".py", ".yaml", ".md", ".jsonl")) or "/" in candidate
        if looks_like_a_path and not candidate.startswith(("http", "-", *MADE_BY_A_RUN)) and "." in candidate:
            paths.append(candidate)
    return paths


def entry_point(command: str) -> list[str] | None:
    """The python invocation a command runs (a script or a module), for --help; None for the other runners."""
    parts = words(command)
    if parts[0] != "python":
        return None
    if parts[1] == "-m":
        return [sys.executable, "-m", parts[2]]
    return [sys.executable, parts[1]] if parts[1].endswith(".py") else None


def test_the_documents_show_commands():
    assert len(COMMANDS) > 40 and {document for document, _ in COMMANDS} >= {"README.md", "benchmark.md"}


@pytest.mark.parametrize("document, command", COMMANDS, ids=[f"{d}: {c[:60]}" for d, c in COMMANDS])
def test_what_a_shown_command_names_exists(document, command):
    missing = [path for path in named_paths(command) if not (ROOT / path).exists() and path not in REMOVED]
    assert missing == [], f"{document}: {command}"
    if command.startswith("make "):
        targets = re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), re.M)
        assert words(command)[1] in targets, f"{document}: {command}"
    if command.startswith("modal run modal_app.py"):
        _, _, entrypoint = words(command)[2].partition("::")
        assert isinstance(getattr(modal_app, entrypoint or "main", None), modal.app.LocalEntrypoint), command


def made_by_the_recipe() -> set[str]:
    """The outputs/ paths a run makes: each config's output_dir and demonstrations, and each --output_dir and
    --demonstrations the documents name."""
    made = set()
    for config in [ROOT / "config.yaml", *(ROOT / "configs").rglob("*.yaml")]:
        keys = yaml.safe_load(config.read_text()) or {}
        made |= {str(keys[k]) for k in ("output_dir", "demonstrations") if isinstance(keys.get(k), str)}
    for document in DOCUMENTS:  # in a command or in the text that tells how a run was made
        made |= set(re.findall(r"--(?:output_dir|demonstrations) (outputs/[^\s`)]+)", document.read_text()))
    return {path.rstrip("/") for path in made if path.startswith("outputs/")}


def test_an_outputs_path_a_command_names_is_one_a_config_or_a_shown_command_makes():
    made = made_by_the_recipe()
    named = {
        (document, word.rstrip("/"))
        for document, command in COMMANDS
        for word in words(command)
        if word.startswith("outputs/")
    }
    # A run's folder, or what evaluate.py writes inside a model's (eval-TASKS) and compare.py beside it.
    unmade = [(d, path) for d, path in named if not any(path == m or path.startswith(m + "/") for m in made)]
    assert len(named) > 10 and unmade == []


# Runs each entry point with --help in this one interpreter, as `python X.py --help` or `python -m X --help` would, and
# prints the exit status of each: one interpreter imports torch and TRL once, not once per entry point.
HELP_OF_EACH = """
import contextlib, io, json, os, runpy, sys
statuses = {}
for invocation in json.loads(sys.argv[1]):
    module = invocation[0] == "-m"
    sys.argv = [invocation[-1], "--help"]
    sys.path.insert(0, os.getcwd() if module else os.path.dirname(os.path.abspath(invocation[0])))
    with contextlib.redirect_stdout(io.StringIO()):
        try:
            if module:
                runpy.run_module(invocation[1], run_name="__main__")
            else:
                runpy.run_path(invocation[0], run_name="__main__")
            statuses[" ".join(invocation)] = "no exit"
        except SystemExit as done:
            statuses[" ".join(invocation)] = done.code or 0
    sys.path.pop(0)
print(json.dumps(statuses))
"""


@pytest.mark.slow
def test_every_entry_point_a_document_shows_answers_help():
    invocations = sorted(
        {tuple(entry[1:]) for _, command in COMMANDS if (entry := entry_point(command)) and entry[-1] not in REMOVED}
    )
    run = subprocess.run(
        [sys.executable, "-c", HELP_OF_EACH, json.dumps(invocations)], cwd=ROOT, capture_output=True, text=True
    )
    statuses = json.loads(run.stdout.splitlines()[-1]) if run.stdout else run.stderr[-3000:]
    assert len(invocations) >= 10 and statuses == {" ".join(i): 0 for i in invocations}


ONE_LINER_S = 120  # each one-liner shown imports the recipe at most (about 20 s here)


@pytest.mark.slow
def test_every_one_liner_a_document_shows_runs():
    one_liners = [command for _, command in COMMANDS if words(command)[:2] == ["python", "-c"]]
    for command in one_liners:
        try:  # a one-liner that serves or waits would hang the suite: it fails instead
            run = subprocess.run(
                [sys.executable, *words(command)[1:]], cwd=ROOT, capture_output=True, text=True, timeout=ONE_LINER_S
            )
        except subprocess.TimeoutExpired:
            pytest.fail(f"{command}\nstill running after {ONE_LINER_S}s")
        assert run.returncode == 0, f"{command}\n{run.stderr[-2000:]}"
