"""Your own task, as a user writes one (tests/own_tasks/coffee: BrowserGym's AbstractBrowserTask and register_task,
outside the project's packages): served beside MiniWoB, played through OpenEnv's public client, isolated, kept to its
origin, checked by the task checker, trained on and evaluated by naming its module; and the tutorial that teaches it
(docs/your_own_task.md) is this very code."""

import json
import random
import re
import shlex
import subprocess
import sys
from types import SimpleNamespace

import pytest
from openenv.core.generic_client import GenericEnvClient

import evaluate as evaluate_py
from browser_rl.command_line import parse_command_line
from browser_rl.episode_settings import EpisodeSettings
from browser_rl.errors import EnvironmentFailure, EnvironmentUnavailable
from browser_rl.evaluation import evaluate
from browser_rl.rollout import EpisodeRunner
from browser_rl.servers import ServerPool
from env_client import LocalEnvServer
from helpers import ROOT, keep_renderer_busy, train_here
from in_process_sessions import sessions_in_this_process
from warm_start.demonstrations import load
from warm_start.record import main as record_main
from web_env import task_modules
from web_env.actions import action_code
from web_env.models import BrowserGymAction
from web_env.server import page_actions
from web_env.server.check_tasks import OtherOrigin, random_action, reach_out
from web_env.server.environment import TaskError

OWN_TASKS = ROOT / "tests" / "own_tasks"
COFFEE = OWN_TASKS / "coffee" / "coffee_task.py"
FAULTY = OWN_TASKS / "faulty_coffee.py"
LATE = OWN_TASKS / "late_coffee.py"
TUTORIAL = ROOT / "docs" / "your_own_task.md"
FILE_BLOCK = re.compile(r'```\w+ title="([^"]+)"\n(.*?)```', re.S)


def element(axtree: str, role: str, name: str) -> str:
    return re.search(rf"\[(\d+)\] {role} '{re.escape(name)}'", axtree).group(1)


def asked_order(goal: str) -> dict:
    """The order the coffee task's goal asks for."""
    size, drink, name = re.fullmatch(r"Order a (\w+) (\w+) for (\w+)\.", goal).groups()
    return {"drink": drink, "size": size, "name": name}


def order_actions(axtree: str, order: dict) -> list[str]:
    """What a person does to place `order` on the coffee page (its full accessibility tree, as the server sends it):
    two clicks, a fill and a click."""
    return [
        f"click('{element(axtree, 'radio', order['drink'])}')",
        f"click('{element(axtree, 'radio', order['size'])}')",
        f"fill('{element(axtree, 'textbox', 'Name on the cup')}', '{order['name']}')",
        f"click('{element(axtree, 'button', 'Place order')}')",
    ]


@pytest.fixture(scope="module")
def coffee_server():
    """A server with the coffee module and its broken variants, started as a training run starts it: given the modules
    the run loaded."""
    modules = [str(COFFEE), str(FAULTY)]
    task_modules.load(modules)
    with LocalEnvServer(max_sessions=4, task_modules=modules, server_args=["--browsers", "1"]) as server:
        yield server


@pytest.fixture(scope="module")
def coffee_env():
    """The server's environment in this process, with the coffee module, its broken variants and its late app."""
    with sessions_in_this_process([str(COFFEE), str(FAULTY), str(LATE)]) as session:
        yield session


def test_the_tutorial_shows_the_test_task_module_file_by_file():
    shown = dict(FILE_BLOCK.findall(TUTORIAL.read_text()))
    assert sorted(shown) == [
        "coffee/app/index.html",
        "coffee/app/thanks.html",
        "coffee/coffee_task.py",
        "coffee/expert.py",
    ]
    for path, text in shown.items():
        assert (OWN_TASKS / path).read_text() == text, f"docs/your_own_task.md's {path} differs from the test's"


def test_an_own_task_is_played_through_openenvs_public_client_with_the_right_reward(coffee_server):
    with GenericEnvClient(base_url=coffee_server.url).sync() as client:
        for seed, wrong in [(4, False), (5, True)]:
            first = client.reset(task_name="order-coffee", seed=seed)
            observation = first.observation
            assert observation["metadata"]["loaded_because"].startswith("a task of a task module")
            order = asked_order(observation["goal"])
            if wrong:
                order["size"] = next(size for size in ("small", "medium", "large") if size != order["size"])
            for action in order_actions(observation["axtree_txt"], order):
                result = client.step({"action_str": action})
                assert result.observation["error"] == ""
            assert (result.reward, result.done) == (0.0 if wrong else 1.0, True)
            assert result.observation["url"] == "http://app.localhost/order"
            assert "Your order is on its way" in result.observation["axtree_txt"]
        # MiniWoB's tasks are served beside it, in the same session.
        assert client.reset(task_name="click-test", seed=1).observation["goal"] == "Click the button."


def test_a_server_without_the_module_refuses_its_task_naming_the_task_and_the_server(coffee_server, tokenizer):
    # A run that loaded the module, on a server started without it (a remote one, say).
    with LocalEnvServer(max_sessions=1, server_args=["--browsers", "1"]) as bare:
        runner = EpisodeRunner(ServerPool([bare.url]), tokenizer, EpisodeSettings(max_turns=1))
        try:
            with pytest.raises(EnvironmentFailure) as failure:
                runner.run([("order-coffee", 0)], policy=None)
        finally:
            runner.close()
    message = str(failure.value)
    assert "unknown task 'order-coffee'" in message and f"(server {bare.url})" in message
    assert "none: it was started without --task_modules" in message


def test_a_setup_that_raises_is_replayed_and_never_scored_and_the_run_says_which_task_and_seed(
    coffee_server, tokenizer
):
    runner = EpisodeRunner(ServerPool([coffee_server.url]), tokenizer, EpisodeSettings(max_turns=1), max_env_failures=1)
    try:
        with pytest.raises(EnvironmentUnavailable, match="failed 2x in a row") as unavailable:
            runner.run_until_played([("coffee-setup-raises", 3)], policy=None)
    finally:
        runner.close()
    message = str(unavailable.value)
    assert "task 'coffee-setup-raises' (seed 3): setup raised FileNotFoundError: app/menu.json" in message


def test_a_setup_or_validate_that_raises_is_an_error_naming_the_task_and_seed_not_a_reward(coffee_env):
    env = coffee_env()
    observation = env.reset(task_name="coffee-validate-raises", seed=7)
    order = asked_order(observation.goal)
    for action in order_actions(observation.axtree_txt, order)[:-1]:
        assert env.step(BrowserGymAction(action_str=action)).reward == 0.0
    with pytest.raises(TaskError, match=r"task 'coffee-validate-raises' \(seed 7\): validate raised KeyError: 'size'"):
        env.step(BrowserGymAction(action_str=order_actions(observation.axtree_txt, order)[-1]))


def test_a_backend_that_raises_answers_500_which_the_page_shows(coffee_env):
    env = coffee_env()
    observation = env.reset(task_name="coffee-backend-raises", seed=1)
    for action in order_actions(observation.axtree_txt, asked_order(observation.goal)):
        observation = env.step(BrowserGymAction(action_str=action))
    assert (observation.error, observation.reward, observation.done) == ("", 0.0, False)
    assert "the app's backend raised ZeroDivisionError: division by zero" in observation.axtree_txt


def test_an_own_tasks_actions_on_a_busy_renderer_are_done_and_none_is_reported_failed(coffee_env, monkeypatch):
    # Every click of BrowserGym's code ran out of its 500 ms here, the order placed all the same by the last one (a CI
    # run met that on a busy machine).
    def browsergym_code(*args, **kwargs):
        raise AssertionError("BrowserGym's code ran, with its 500 ms deadlines")

    monkeypatch.setattr(page_actions, "execute_python_code", browsergym_code)
    env = coffee_env()
    observation = env.reset(task_name="order-coffee", seed=6)
    env.act_with(lambda task, page: keep_renderer_busy(page))
    for action in order_actions(observation.axtree_txt, asked_order(observation.goal)):
        result = env.step(BrowserGymAction(action_str=action))
        assert result.error == "", action
    # The last click waited for the order's post and the page it led to, as BrowserGym's click waits.
    assert (result.reward, result.done) == (1.0, True)
    assert "Your order is on its way" in result.axtree_txt


def test_an_own_tasks_click_waits_for_its_app_s_answer_however_late_and_reports_no_failure(coffee_env):
    # The app answers the order five times later than the deadline of Playwright's waits in the episode's context, as
    # an app answers late on a busy machine: a CI run's bill payment was reported failed past the task's 5 s, with its
    # click done and the app's answer on its way.
    env = coffee_env()
    observation = env.reset(task_name="coffee-answers-late", seed=6)
    for action in order_actions(observation.axtree_txt, asked_order(observation.goal)):
        result = env.step(BrowserGymAction(action_str=action))
        assert result.error == "", action
    assert (result.reward, result.done) == (1.0, True)
    assert "Your order is on its way" in result.axtree_txt


def test_concurrent_sessions_and_consecutive_episodes_share_nothing(coffee_env):
    first, second = coffee_env(), coffee_env()
    fresh = second.reset(task_name="coffee-remembers-in-the-browser", seed=2)
    first.reset(task_name="coffee-remembers-in-the-browser", seed=2)
    solved = first.act_with(lambda task, page: task.cheat(page, []))
    assert (solved.reward, solved.done) == (1.0, True)
    # The page kept the order in its storage; the next episode, in the same page, starts from nothing.
    again = first.reset(task_name="coffee-remembers-in-the-browser", seed=2)
    assert (again.goal, again.axtree_txt) == (fresh.goal, fresh.axtree_txt)
    assert "Your last order" not in again.axtree_txt
    assert first.act_with(lambda task, page: None).reward == 0.0
    assert second.act_with(lambda task, page: None).reward == 0.0


def test_an_episodes_backend_is_out_of_reach_once_the_session_plays_another_task(coffee_env):
    env = coffee_env()
    env.reset(task_name="order-coffee", seed=0)
    shops = []
    env.act_with(lambda task, page: shops.append(task.shop))
    env.reset(task_name="click-test", seed=0)
    post = "fetch('http://app.localhost/order', {method: 'POST', mode: 'no-cors', body: 'drink=latte'}).catch(() => 0)"
    env.act_with(lambda task, page: page.evaluate(post) or page.wait_for_timeout(300))
    assert shops[0].orders == []


def test_a_task_page_reaches_no_other_origin(coffee_env):
    env = coffee_env()
    other = OtherOrigin()
    try:
        env.reset(task_name="order-coffee", seed=0)
        env.act_with(reach_out(other.url))
        env.reset(task_name="click-test", seed=0)  # MiniWoB's pages neither
        env.act_with(reach_out(other.url))
    finally:
        other.close()
    assert other.hits == []


def test_the_checkers_random_actions_are_all_ones_a_policy_may_take():
    page = SimpleNamespace(axtree_txt="[12] button 'Place order'\n[13] textbox 'Name on the cup'")
    rng = random.Random(0)
    written = [random_action(page, rng) for _ in range(300)]
    for action in written:
        action_code(action)  # raises for an action the allowlist refuses
    assert len({action.split("(")[0] for action in written}) == 10


@pytest.mark.slow
def test_the_checker_passes_the_tutorials_task_and_names_each_fault_of_the_broken_ones():
    checked = subprocess.run(
        [
            sys.executable,
            "-m",
            "web_env.server.check_tasks",
            str(COFFEE),
            str(FAULTY),
            "--seeds",
            "3",
            "--random_actions",
            "5",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    failures = [line for line in checked.stdout.splitlines() if line.startswith("FAIL")]
    assert checked.returncode == 1, checked.stdout + checked.stderr[-3000:]
    failing = {line.split()[1].rstrip(":") for line in failures}
    assert failing == {
        "coffee-ignores-seed",
        "coffee-draws-anew",
        "coffee-shows-the-last-order",
        "coffee-forwards-requests",
        "coffee-wrong-order-goes-on",
        "coffee-setup-raises",
        "coffee-backend-raises",
        "coffee-validate-raises",
        "coffee-pays-any-order",
        "coffee-shares-its-backend",
    }, checked.stdout
    text = "\n".join(failures)
    assert "FAIL coffee-ignores-seed: 3 seeds gave 1 distinct instance(s)" in text
    assert (
        "FAIL coffee-draws-anew seed 0: in a session that played before, the goal or page differs from a fresh"
        " session's of the same seed" in text
    )
    assert (
        "FAIL coffee-shows-the-last-order seed 0: in the episode after a solved one, the goal or page differs" in text
    )
    assert "FAIL coffee-forwards-requests: requests to another origin went through" in text
    assert (
        "FAIL coffee-wrong-order-goes-on seed 0: wrong ending order_the_wrong_size: reward 0.0, done False, where it"
        " should end the episode with reward 0" in text
    )
    assert "FAIL coffee-backend-raises seed 0: cheat did not solve it: reward 0.0, done False" in text
    assert "FAIL coffee-setup-raises: TaskError: task 'coffee-setup-raises' (seed 0): setup raised" in text
    assert "FAIL coffee-validate-raises: TaskError: task 'coffee-validate-raises' (seed 0): validate raised" in text
    assert "FAIL coffee-pays-any-order seed 0: wrong ending order_the_wrong_size: reward 1.0" in text
    assert "FAIL coffee-shares-its-backend seed 0: a session paid for what another session did" in text
    assert "FAIL coffee-shares-its-backend seed 0: an episode paid for what the one before it did" in text
    assert "order-coffee: a reset in a fresh session takes" in checked.stdout


def tutorial_command(script: str) -> list[str]:
    """The arguments of the tutorial's CPU command for `script` (train.py, evaluate.py, -m warm_start.record), less
    the model and what it writes, which the test gives its own."""
    (line,) = [line for line in TUTORIAL.read_text().splitlines() if line.startswith(f"python {script} ")]
    words = shlex.split(line)[1 + len(script.split()) :]
    pairs = [words[i : i + 2] for i in range(0, len(words), 2)]
    given_here = ("--model_name_or_path", "--model", "--output_dir", "--demonstrations")
    return [word for pair in pairs if pair[0] not in given_here for word in pair]


@pytest.mark.slow
def test_the_tutorials_commands_train_on_the_task_and_evaluate_it(tiny_model, tmp_path, monkeypatch):
    monkeypatch.chdir(OWN_TASKS)  # where coffee/ is, as in the reader's folder: the commands name coffee/coffee_task.py
    train_args = tutorial_command("train.py")
    assert train_args[:6] == [
        "--config",
        "configs/smoke.yaml",
        "--task_modules",
        "coffee/coffee_task.py",
        "--task_name",
        "order-coffee",
    ]
    log = train_here(tiny_model, tmp_path / "run", *train_args[2:], "--max_steps", "2", "--save_steps", "2")
    assert "step 2/2 | success" in log, log[-3000:]
    steps = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert len([step["tasks/order-coffee/success_rate"] for step in steps if "episodes/count" in step]) == 2
    assert (tmp_path / "run" / "checkpoint-2").is_dir()
    eval_args = tutorial_command("evaluate.py")
    args, tasks, episodes, servers = parse_command_line(
        evaluate_py.OPTIONS,
        [*eval_args, "--model", str(tmp_path / "run"), "--episodes", "4", "--output_dir", str(tmp_path / "eval")],
    )
    summary = evaluate(args, tasks, episodes, servers)
    records = [json.loads(line) for line in (tmp_path / "eval" / "episodes.jsonl").read_text().splitlines()]
    assert summary["episodes"] == 4 and {record["task_name"] for record in records} == {"order-coffee"}

    record_args = tutorial_command("-m warm_start.record")
    assert record_args[:4] == ["--task_modules", "coffee/coffee_task.py", "--tasks", "order-coffee"]
    demonstrations = tmp_path / "coffee.jsonl"
    record_main([*record_args, "--model_name_or_path", tiny_model, "--demonstrations", str(demonstrations)])
    recorded = load(demonstrations, keep_failed=True)
    assert len(recorded) == 20 and all(d.solved for d in recorded)  # by coffee/expert.py, found beside the module
