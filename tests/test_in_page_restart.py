"""An episode restarted in the page its task already loaded is the episode a fresh load of the same seed gives, for
every MiniWoB task the server accepts: the same goal, accessibility tree, and reward, termination, error and tree
after the scripted (or a fixed) actions, whatever state the episode before it was left in. The environment runs in
this process, two sessions on two browsers: one that restarts whenever it can, one that loads every episode.

Each task plays one seed, the recipe's page-reading tasks and click-test three; BROWSER_RL_RESTART_SEEDS=6 plays six
of every task (docs/environment.md)."""

import os
import re
from concurrent.futures import ThreadPoolExecutor

import pytest

import env_server
import miniwob_env
from env_protocol import BrowserGymAction
from miniwob_env import LOADED_AFRESH, TASK_CLASSES, BrowserPool, MiniWoBEnvironment
from scripted_policy import PLANS, plan
from tasks import PRESETS

FIELDS = ["goal", "axtree_txt", "error"]
ACTIONABLE = "button|link|checkbox|radio|textbox|searchbox|spinbutton|combobox|tab|menuitem|option|slider|treeitem"
# What the episode before the compared one was left in, by a task's place in the list and the seed's: each state
# comes up for a quarter of the tasks, and for each task with four seeds or more, all of them.
BEFORE = ("untouched", "half done", "timed out", "played out")
SEEDS = int(os.environ.get("BROWSER_RL_RESTART_SEEDS", "1"))
THREE_SEEDS = {"click-test", *PRESETS["page-reading"]}
# Pages that change by themselves, so that two loads of one seed differ too: only the goals are compared. BrowserGym
# marks four such tasks; stock-market redraws its price every 100 ms.
TIME_DEPENDENT = {"stock-market", *(task for task, cls in TASK_CLASSES.items() if cls.nondeterministic)}


@pytest.fixture(scope="module")
def sessions():
    env_server.use_packaged_miniwob_pages()
    env_server.ensure_chromium()
    pool = BrowserPool(2)
    restarting, loading = MiniWoBEnvironment(pool), MiniWoBEnvironment(pool, reload_every=1)
    yield restarting, loading
    restarting.close()
    loading.close()


def fixed_actions(task: str, goal: str, page: str, right: bool) -> list[str]:
    """The scripted plan's actions (right, or with a wrong first one); else a fill or click of the page's first
    elements that take one."""
    if task in PLANS:
        steps = plan(task, goal, page)
        return steps.right if right else [steps.wrong[0], *steps.right[1:]]
    elements = re.findall(rf"\[(\w+)\] ({ACTIONABLE})\b", page)[:2]
    fills = ("textbox", "searchbox", "spinbutton")
    return [f"fill('{bid}', 'hello')" if role in fills else f"click('{bid}')" for bid, role in elements] or ["noop()"]


def play(session: MiniWoBEnvironment, task: str, seed: int, right: bool) -> tuple[bool, list]:
    """Whether the reset restarted the page, and the episode: goal and tree, then each action's outcome."""
    observation = session.reset(task_name=task, seed=seed, fields=FIELDS)
    trace = [(observation.goal, observation.axtree_txt)]
    for action in fixed_actions(task, observation.goal, observation.axtree_txt, right):
        result = session.step(BrowserGymAction(action_str=action))
        trace.append((result.reward, result.done, result.error, result.axtree_txt))
        if result.done:
            break
    return observation.metadata["restarted_in_page"], trace


def leave(session: MiniWoBEnvironment, task: str, seed: int, state: str) -> None:
    """An episode of `task` left in `state`: untouched, half done (one action), timed out (MiniWoB's own end of a
    timed-out episode), or played out."""
    observation = session.reset(task_name=task, seed=seed, fields=FIELDS)
    actions = fixed_actions(task, observation.goal, observation.axtree_txt, right=False)
    if state == "timed out":
        session._worker.call(session._page.evaluate, "core.endEpisode(-1, false, 'timed out')")
    for action in actions[: {"half done": 1, "played out": len(actions)}.get(state, 0)]:
        session.step(BrowserGymAction(action_str=action))


@pytest.mark.parametrize("task", sorted(TASK_CLASSES))
def test_a_restarted_episode_is_the_episode_a_fresh_load_gives(sessions, task):
    restarting, loading = sessions
    place = sorted(TASK_CLASSES).index(task)
    for n, seed in enumerate(range(11, 11 + max(SEEDS, 3 if task in THREE_SEEDS else 1))):
        leave(restarting, task, seed + 1000, BEFORE[(place + n) % len(BEFORE)])
        with ThreadPoolExecutor(max_workers=2) as both:
            restarted = both.submit(play, restarting, task, seed, right=n % 2 == 0)
            loaded = both.submit(play, loading, task, seed, right=n % 2 == 0)
            (in_page, episode), (_, reference) = restarted.result(), loaded.result()
        if task in TIME_DEPENDENT:
            episode, reference = episode[0][0], reference[0][0]
        assert episode == reference, (task, seed, BEFORE[(place + n) % len(BEFORE)], in_page)
        if task in LOADED_AFRESH:
            assert not in_page


def test_the_page_reading_tasks_restart_in_place_but_where_listed(sessions):
    restarting, _ = sessions
    for task in PRESETS["page-reading"]:
        restarting.reset(task_name=task, seed=1, fields=FIELDS)
        in_page = restarting.reset(task_name=task, seed=2, fields=FIELDS).metadata["restarted_in_page"]
        assert in_page == (task not in LOADED_AFRESH and task != "click-tab"), task  # click-tab: jQuery UI's tabs


def test_a_session_moves_to_a_new_browser_context_every_context_episodes(sessions, monkeypatch):
    restarting, _ = sessions
    monkeypatch.setattr(miniwob_env, "CONTEXT_EPISODES", 3)
    restarting.reset(task_name="click-test", seed=1, fields=FIELDS)
    context = restarting._context
    while restarting._episodes_in_context < miniwob_env.CONTEXT_EPISODES:
        assert restarting.reset(task_name="click-test", seed=2, fields=FIELDS).metadata["restarted_in_page"]
        assert restarting._context is context
    renewed = restarting.reset(task_name="click-test", seed=3, fields=FIELDS)
    assert restarting._context is not context and not renewed.metadata["restarted_in_page"]
    assert renewed.goal == "Click the button." and "button 'Click Me!'" in renewed.axtree_txt
