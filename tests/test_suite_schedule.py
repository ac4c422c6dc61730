"""The suite's own schedule: `make test` and `make test-all` hand whole test files to two processes, the longest
first, so that no long file starts while the other process is about to run out of work, and each process computes on
one thread (docs/test_suite.md)."""

import re
import subprocess
import sys

import torch

from conftest import FILE_SECONDS, file_of
from helpers import ROOT


def test_the_collection_runs_the_longest_files_first_and_files_not_yet_measured_before_them(request):
    files = list(dict.fromkeys(file_of(item) for item in request.session.items))
    seconds = [FILE_SECONDS.get(file, float("inf")) for file in files]
    assert seconds == sorted(seconds, reverse=True), files


def test_make_test_and_test_all_hand_out_the_files_in_the_collections_order_to_two_processes():
    # pytest-xdist's loadfile otherwise orders the files by their number of tests, which puts the long one-test
    # files last.
    recipes = dict(re.findall(r"^(test|test-all):.*\n\t(.*)", (ROOT / "Makefile").read_text(), re.M))
    assert set(recipes) == {"test", "test-all"}
    for recipe in recipes.values():
        assert "-n 2 --dist loadfile --no-loadscope-reorder" in recipe


def test_the_measured_files_are_the_suites_files():
    files = {path.relative_to(ROOT).as_posix() for path in (ROOT / "tests").glob("test_*.py")}
    assert set(FILE_SECONDS) <= files  # a renamed or removed file is measured again


def test_each_test_process_and_what_it_starts_runs_torch_on_one_thread():
    """Two processes' torch threads on two cores spin waiting for each other (tests/conftest.py)."""
    assert torch.get_num_threads() == 1
    started = subprocess.run(
        [sys.executable, "-c", "import torch; print(torch.get_num_threads())"], capture_output=True, text=True
    )
    assert started.stdout.strip() == "1", started.stderr[-2000:]
