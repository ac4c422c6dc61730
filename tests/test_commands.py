"""Every command README.md and docs/ show runs as written: the files, configs and make targets it names exist, and
(slow tier) every entry point it runs answers --help; a `python -c` one-liner runs; each of the README's commands
names the test that runs it and how that run differs from the one shown (RUN_BY)."""

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
# The documents whose command blocks are a user's to run: each block's command names its test in RUN_BY. The other
# documents are research notes, whose blocks record how a figure was made (minutes to hours each, at the commit the
# note names): what those name exists and their entry points answer --help (below).
USERS_DOCUMENTS = ("README.md", "guide.md", "your_own_task.md")


def block_commands(document: str) -> list[str]:
    """The commands of a document's ```bash blocks, each on one line with its spaces collapsed."""
    text = (ROOT / document if document == "README.md" else ROOT / "docs" / document).read_text()
    return [
        " ".join(line.split("  #")[0].split())
        for block in re.findall(r"^```(?:bash|sh)\n(.*?)^```", text, re.S | re.M)
        for line in block.replace("\\\n", " ").splitlines()
        if line.split(" ")[0] in RUNNERS
    ]


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


# Each command of a user's document, by the start of its line: the test that runs it, and where that test runs it
# otherwise than as shown, how and why (this machine has no GPU, no Docker engine, no Modal account and no Hub; a shown
# run of hours is run for a step or two).
SLOW_RUN = "the shown run takes minutes to hours here: the test runs it on the tiny LFM2 for a step or a few episodes"
FROM_THE_HUB = "the config's model is on the Hub: the test runs the same options on the tiny LFM2, sized down"
REAL_MODEL_PATH = "tests/test_real_model.py::test_a_gguf_file_records_warms_up_trains_a_grpo_step_and_evaluates"
REAL_SIZED_DOWN = "the test records, warms up, trains a step and evaluates the real model on click-test, sized down"
CURRICULUM = "tests/test_train.py::test_the_curriculum_starts_from_an_evaluation_sampled_at_the_training_temperature"
CLONING_SIZED_DOWN = (
    "the shown recording takes 17 minutes here: the test records a tiny LFM2's own episodes of click-test (the "
    "config's options: tests/test_config.py -k page_reading_steps)"
)
NO_HUB = "no Hub here: the test checks the folder a push uploads"
SERVED = "tests/test_run_agent.py::test_a_served_model_plays_exactly_the_episodes_it_plays_in_process"
MODAL_COMMANDS = "tests/test_modal_app.py::test_each_command_ships_its_config_and_options_and_says_where_its_output_is"
TUTORIAL = "tests/test_own_tasks.py::test_the_tutorials_commands_train_on_the_task_and_evaluate_it"
WORKFLOWS_AS_WRITTEN = "tests/test_workflows.py::test_the_readmes_workflow_commands_record_warm_up_train_and_evaluate"
RUN_BY = {
    "make smoke": ("tests/test_train.py::test_train_py_starts_its_own_server_and_stops_it_at_exit", SLOW_RUN),
    "make test": (".ci/run", None),
    "make real-model": (
        "tests/test_real_model.py::test_the_real_model_is_built_from_its_wheel_as_an_ordinary_checkpoint_that_answers",
        None,
    ),
    "python -m warm_start.record --config configs/warm_up/smollm2_page_reading_cpu.yaml": (
        REAL_MODEL_PATH,
        REAL_SIZED_DOWN,
    ),
    "python -m warm_start.warm_up --config configs/warm_up/smollm2_page_reading_cpu.yaml": (
        "tests/test_warm_up.py::test_a_warm_up_with_validation_keeps_the_model_of_its_lowest_validation_loss",
        "the shown warm-up takes 22 minutes here: the test runs the config's early stop on a tiny LFM2's click-test "
        "demonstrations",
    ),
    "python -m warm_start.record --config configs/warm_up/smollm2_page_reading_bc_cpu.yaml": (
        "tests/test_warm_up.py::test_filtered_behaviour_cloning_records_a_models_own_episodes_with_the_settings_it_was_trained_with",
        CLONING_SIZED_DOWN,
    ),
    "python -m warm_start.warm_up --config configs/warm_up/smollm2_page_reading_bc_cpu.yaml": (
        REAL_MODEL_PATH,
        REAL_SIZED_DOWN,
    ),
    "python evaluate.py --model outputs/smollm2-page-reading-warm-up --tasks page-reading": (
        "tests/test_evaluate.py::test_evaluate_a_task_list_prints_a_table_per_task_and_draws_it",
        SLOW_RUN,
    ),
    "python train.py --config configs/smollm2_page_reading_cpu.yaml": (
        "tests/test_dynamic_sampling.py::test_a_real_grpo_step_trains_on_the_groups_that_disagree",
        "hours here: the test runs --informative_groups and --beta 0.04 for two steps on the tiny LFM2",
    ),
    "python evaluate.py --model outputs/smollm2-page-reading --tasks page-reading --episodes 50": (
        "tests/test_evaluate.py::test_evaluate_a_task_list_prints_a_table_per_task_and_draws_it",
        SLOW_RUN,
    ),
    "python compare.py": (
        "tests/test_comparison.py::test_compare_py_on_two_real_evaluations_prints_the_pairs_and_writes_them",
        None,
    ),
    "python train.py --config config.yaml --use_peft": (
        "tests/test_train.py::test_lora_trains_and_writes_an_adapter_that_loads",
        FROM_THE_HUB,
    ),
    "python train.py --config config.yaml --task_modules": (
        "tests/test_own_tasks.py::test_the_tutorials_commands_train_on_the_task_and_evaluate_it",
        FROM_THE_HUB,
    ),
    "python train.py --config config.yaml --env_url": (
        "tests/test_train.py::test_full_fine_tune_trains_and_writes_a_checkpoint_that_loads",
        FROM_THE_HUB,
    ),
    "python train.py --config config.yaml": (
        "tests/test_train.py::test_full_fine_tune_trains_and_writes_a_checkpoint_that_loads",
        FROM_THE_HUB,
    ),
    "modal setup": (
        "tests/test_modal_app.py::test_importing_defines_the_app_and_its_gpu_function_with_the_default_settings",
        "a Modal account: the test builds the app without one",
    ),
    "modal run modal_app.py --config": (
        "tests/test_modal_app.py::test_modal_run_ships_the_config_text_with_its_options_and_says_where_the_result_is",
        "Modal's cloud: the test runs the entrypoint on this machine and the functions with .local()",
    ),
    "modal run modal_app.py::evaluate": (
        "tests/test_modal_app.py::test_the_whole_path_runs_in_the_volume_recording_warm_up_training_and_evaluation",
        "Modal's cloud: the test runs the functions with .local() in a stand-in volume",
    ),
    "modal volume get": (
        "tests/test_modal_app.py::test_the_whole_path_runs_in_the_volume_recording_warm_up_training_and_evaluation",
        "Modal's cloud: the test reads the run from a stand-in volume",
    ),
    "python evaluate.py --model outputs/smollm2-page-reading --tasks page-reading --episodes 8 --traces failures": (
        "tests/test_evaluate.py::test_evaluate_a_full_model_writes_episodes_summary_and_the_traces_asked_for",
        SLOW_RUN,
    ),
    "python -m web_env.server.check_tasks tests/own_tasks/coffee/coffee_task.py": (
        "tests/test_own_tasks.py::test_the_checker_passes_the_tutorials_task_and_names_each_fault_of_the_broken_ones",
        None,
    ),
    "python -m warm_start.record --config configs/warm_up/workflows.yaml": (WORKFLOWS_AS_WRITTEN, FROM_THE_HUB),
    "python -m warm_start.warm_up --config configs/warm_up/workflows.yaml": (WORKFLOWS_AS_WRITTEN, FROM_THE_HUB),
    "python train.py --config configs/workflows.yaml": (WORKFLOWS_AS_WRITTEN, FROM_THE_HUB),
    "python evaluate.py --config configs/workflows.yaml": (WORKFLOWS_AS_WRITTEN, FROM_THE_HUB),
    "python -m warm_start.record --config configs/warm_up/book_flight.yaml": (
        "tests/test_experts.py::test_each_expert_solves_its_task_reading_the_page_as_the_prompt_cuts_it",
        SLOW_RUN,
    ),
    "python -m warm_start.warm_up --config configs/warm_up/book_flight.yaml": (
        "tests/test_warm_up.py::test_warm_up_fine_tunes_a_demonstrations_file_with_lora_into_a_whole_model_train_py_starts_from",
        FROM_THE_HUB,
    ),
    "python train.py --config configs/book_flight.yaml": (
        "tests/test_train.py::test_full_fine_tune_trains_and_writes_a_checkpoint_that_loads",
        FROM_THE_HUB,
    ),
    "python evaluate.py --model outputs/lfm2-350m-click-test": (
        "tests/test_evaluate.py::test_evaluate_a_full_model_writes_episodes_summary_and_the_traces_asked_for",
        FROM_THE_HUB,
    ),
    "python evaluate.py --model outputs/smollm2-page-reading --tasks page-reading --episodes 50 --temperature 1": (
        "tests/test_evaluate.py::test_evaluate_a_task_list_prints_a_table_per_task_and_draws_it",
        SLOW_RUN,
    ),
    "python evaluate.py --model outputs/smollm2-page-reading --benchmark miniwob": (
        "tests/test_evaluate.py::test_the_protocol_end_to_end_resumes_after_a_crash_and_refuses_another_evaluation_s_directory",
        SLOW_RUN,
    ),
    "python run_agent.py --model outputs/smollm2-page-reading --task_name click-tab --dry_run": (
        "tests/test_run_agent.py::test_an_action_declined_in_a_dry_run_is_not_taken_and_the_episode_ends",
        "the test's model is the tiny LFM2, its task click-test",
    ),
    "python export_gguf.py --model outputs/smollm2-page-reading --output agent.gguf --outtype q8_0": (
        "tests/test_gguf_export.py::test_an_eight_bit_export_is_a_quarter_the_size_and_close",
        "the test exports the tiny LFM2; tests/test_gguf_export.py exports the real model too, exactly",
    ),
    "python -m web_env.server --port 8000": (
        "tests/test_layout.py::test_the_environment_package_installs_alone_and_its_server_runs_from_the_installed_copy",
        None,
    ),
    "docker ": (
        "tests/test_env_server.py::test_openenvs_from_docker_image_starts_the_container_with_the_token_the_client_sends",
        "no Docker engine here: the test checks what OpenEnv asks Docker for",
    ),
    "torchrun --nproc_per_node 4": (
        "tests/test_data_parallel.py::test_two_ranks_train_one_model_on_one_pool_and_log_each_step_once",
        "no GPU here: two ranks on the CPU (gloo)",
    ),
    "accelerate launch --config_file configs/accelerate/zero2.yaml": (
        "tests/test_data_parallel.py::test_two_ranks_train_one_model_on_one_pool_and_log_each_step_once",
        "no GPU here for DeepSpeed: two ranks of DDP on the CPU (gloo)",
    ),
    "accelerate launch --config_file configs/accelerate/ddp.yaml": (
        "tests/test_data_parallel.py::test_two_ranks_train_one_model_on_one_pool_and_log_each_step_once",
        "no GPU here: two ranks on the CPU (gloo)",
    ),
    "python train.py --config config.yaml --tasks page-reading": (
        "tests/test_train.py::test_a_run_on_several_tasks_reports_each_to_the_tracker",
        FROM_THE_HUB,
    ),
    "python train.py --config config.yaml --tasks login-user:2 click-button enter-text --curriculum true": (
        CURRICULUM,
        FROM_THE_HUB,
    ),
    "python evaluate.py --model my-warm-up --config my.yaml": (CURRICULUM, "my.yaml is the reader's: the smoke config"),
    "python train.py --config my.yaml --curriculum true --curriculum_start": (
        CURRICULUM,
        "my.yaml is the reader's: the smoke config",
    ),
    "python evaluate.py --model outputs/book-flight --config configs/book_flight.yaml": (
        "tests/test_evaluate.py::test_evaluate_a_full_model_writes_episodes_summary_and_the_traces_asked_for",
        FROM_THE_HUB,
    ),
    "python run_agent.py --model outputs/smollm2-page-reading --task_name click-tab --seed": (
        "tests/test_run_agent.py::test_the_agent_prints_each_action_it_takes_and_writes_the_episode_s_trace_and_viewer",
        "the tiny LFM2 on click-test",
    ),
    "python run_agent.py --model outputs/smollm2-page-reading --task_name login-user --dry_run": (
        "tests/test_run_agent.py::test_an_action_declined_in_a_dry_run_is_not_taken_and_the_episode_ends",
        "the tiny LFM2 on click-test",
    ),
    "python run_agent.py --model outputs/smollm2-page-reading --task_name login-user --headed": (
        "tests/test_run_agent.py::test_a_headed_agent_plays_in_a_browser_window_on_the_display",
        "the tiny LFM2 on click-test, on an Xvfb display",
    ),
    "python run_agent.py --model agent.gguf": (
        "tests/test_gguf_export.py::test_an_exported_policy_plays_the_same_greedy_episodes_through_the_gguf_policy_path",
        "the tiny LFM2's exported file played through the policy run_agent.py loads, on click-test",
    ),
    "python run_agent.py --model outputs/workflows --url": (
        "tests/test_allowed_origins.py::test_run_agent_plays_a_goal_of_yours_on_a_page_you_name",
        "the tiny LFM2 on a notes app in its own process",
    ),
    "python train.py --config configs/smollm2_page_reading_cpu.yaml --push_to_hub": (
        "tests/test_train.py::test_the_folder_a_run_pushes_to_the_hub_holds_its_episode_settings_and_the_recipes_model_card",
        NO_HUB,
    ),
    "python -m warm_start.warm_up --config configs/warm_up/smollm2_page_reading_cpu.yaml --push_to_hub": (
        "tests/test_warm_up.py::test_the_warm_up_pushes_its_model_folder_with_settings_and_card_to_the_repository_named",
        NO_HUB,
    ),
    "python run_agent.py --model you/web-agent": (
        "tests/test_episode_settings.py::test_a_hub_ids_saved_settings_are_read_from_the_hub_or_offline_from_its_cache",
        "no Hub here: the Hub id's settings are read from a local cache, offline",
    ),
    "python -m http.server 8321": (
        "tests/test_allowed_origins.py::test_an_episode_plays_on_the_app_where_it_runs_and_its_reset_names_the_origins_allowed",
        "on a free port, which the task module reads from NOTES_APP_URL",
    ),
    "python -m vllm.entrypoints.openai.api_server": (SERVED, "the real model in float32, eager, on vLLM's CPU build"),
    "python evaluate.py --model http://": (SERVED, "run_agent.py's endpoint policy, the one evaluate.py loads"),
    "python run_agent.py --model http://": (SERVED, "the real model in float32 on vLLM's CPU build"),
    "python run_agent.py --model http://127.0.0.1:8000 --task_modules": (
        SERVED,
        "vLLM's CPU build in place of llama-server, which the suite does not build; the notes app is "
        "tests/test_allowed_origins.py's",
    ),
    "python export_gguf.py --model outputs/smollm2-page-reading --output agent.gguf": (
        "tests/test_gguf_export.py::test_a_model_exported_exactly_reads_back_with_the_same_weights_tokenizer_and_settings",
        "the tiny LFM2 and a Llama of its size; tests/test_gguf_export.py exports the real model too",
    ),
    "modal run modal_app.py": (
        "tests/test_modal_app.py::test_modal_run_ships_the_config_text_with_its_options_and_says_where_the_result_is",
        "Modal's cloud: the test runs the entrypoint on this machine and the functions with .local()",
    ),
    "modal run modal_app.py::record": (MODAL_COMMANDS, "Modal's cloud: the test runs the entrypoint on this machine"),
    "modal run modal_app.py::warm_up": (MODAL_COMMANDS, "Modal's cloud: the test runs the entrypoint on this machine"),
    "modal volume put": (
        "tests/test_modal_app.py::test_the_whole_path_runs_in_the_volume_recording_warm_up_training_and_evaluation",
        "Modal's own CLI: the test's commands read and write a stand-in volume",
    ),
    "python -m web_env.server.check_tasks coffee/coffee_task.py": (
        "tests/test_own_tasks.py::test_the_checker_passes_the_tutorials_task_and_names_each_fault_of_the_broken_ones",
        None,
    ),
    "python train.py --config configs/smoke.yaml --task_modules coffee/coffee_task.py": (TUTORIAL, "two steps"),
    "python evaluate.py --model outputs/coffee": (TUTORIAL, "four episodes"),
    "python -m warm_start.record --task_modules coffee/coffee_task.py": (TUTORIAL, None),
    "python run_agent.py --model outputs/coffee": (
        "tests/test_run_agent.py::test_a_headed_agent_plays_in_a_browser_window_on_the_display",
        "the tiny LFM2 on click-test, on an Xvfb display",
    ),
    "python -m web_env.server --task_modules coffee/coffee_task.py": (
        "tests/test_own_tasks.py::test_an_own_task_is_played_through_openenvs_public_client_with_the_right_reward",
        None,
    ),
}


def run_by(document: str, command: str) -> str:
    """The RUN_BY key a user's command starts with, the longest."""
    keys = [key for key in RUN_BY if command.startswith(key)]
    assert keys, f"{document} shows `{command}` and no test is named for it in RUN_BY"
    return max(keys, key=len)


def test_every_command_a_users_document_shows_names_the_test_that_runs_it_and_how_it_differs():
    shown = [(document, command) for document in USERS_DOCUMENTS for command in block_commands(document)]
    assert len(shown) > 60
    used = {run_by(document, command) for document, command in shown}
    assert used == set(RUN_BY), f"named for no command a user's document shows: {set(RUN_BY) - used}"
    for test, _ in RUN_BY.values():
        if test == ".ci/run":  # CI's own run, both tiers, after `make setup` and `make windowed-browser`
            assert "make test-all" in (ROOT / ".ci/run").read_text()
            continue
        path, _, name = test.partition("::")
        assert re.search(rf"^def {name}\(", (ROOT / path).read_text(), re.M), f"no test {test}"


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
