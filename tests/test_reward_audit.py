"""Every task whose page pays a positive raw reward for an ending other than the task done right (docs/reward_audit.md)
scores that ending 0 and its right ending 1, on several seeds: each ending played in a real page of the environment
server's own sessions (web_env/server/environment.py, in this process), with the
allowed actions where they reach the page's controls and with the pointer where the task scores where it lands (its
targets have no id, or it wants a point, a path or a pointer that follows a moving shape), then scored as the server
reports it (its observation's `raw_reward`) by rewards.solved, beside BrowserGym's own scoring, which pays them all.
The pages whose endings the allowed actions reach are played again through the server's wire, by OpenEnv's public
client: the reward any client gets."""

import math
import re
import subprocess
import sys

import pytest
from openenv.core.generic_client import GenericEnvClient

import rewards
from browser_rl.episode_settings import EpisodeSettings
from browser_rl.evaluation import episode_record
from browser_rl.evaluation_report import summarize
from browser_rl.generation import reply_of_text
from browser_rl.metrics import episode_metrics
from browser_rl.rollout import EpisodeRunner
from browser_rl.servers import ServerPool
from browser_rl.tasks import TaskSampler
from helpers import ROOT, side_by_side
from in_process_sessions import browsers, new_session
from warm_start.page_tree import find, nodes
from web_env import scoring
from web_env.models import BrowserGymAction

SEEDS = (0, 1, 2)
OBSERVED = ["goal", "axtree_txt", "error"]
# bisect-angle's seed 1 draws an angle of 2 degrees, narrower than the page's marker can be aimed into at its distance.
SEEDS_OF = {"bisect-angle": (0, 2, 3)}


class Ending:
    """One episode of one task instance in a session of the environment: its first observation, allowed actions,
    the pointer, and what the page scored at the end."""

    def __init__(self, session, task: str, seed: int):
        self.session, self.task = session, task
        self.first = session.reset(task_name=task, seed=seed, fields=OBSERVED)
        self.goal, self.tree = self.first.goal, self.first.axtree_txt

    def act(self, action: str):
        observation = self.session.step(BrowserGymAction(action_str=action))
        self.tree = observation.axtree_txt
        return observation

    def js(self, script: str, argument=None):
        return self.session._worker.call(self.session._page.evaluate, script, argument)

    def click(self, x: float, y: float) -> None:
        self.session._worker.call(self.session._page.mouse.click, x, y)

    def move(self, x: float, y: float, steps: int = 1) -> None:
        self.session._worker.call(self.session._page.mouse.move, x, y, steps=steps)

    def drag(self, points: list[tuple[float, float]]) -> None:
        """The pointer pressed at the first point, moved through the others, released at the last."""
        page = self.session._page

        def draw():
            page.mouse.move(*points[0])
            page.mouse.down()
            for point in points[1:]:
                page.mouse.move(*point)
            page.mouse.up()

        self.session._worker.call(draw)

    def center(self, selector: str) -> tuple[float, float]:
        """The page point at the centre of the first element matching `selector`."""
        box = self.js(
            f"() => {{ const r = document.querySelector({selector!r}).getBoundingClientRect(); "
            "return [r.x + r.width / 2, r.y + r.height / 2]; }"
        )
        return tuple(box)

    def scored(self) -> tuple[bool, float, float, float, bool]:
        """(done, the server's reward, BrowserGym's score, the page's raw reward, solved as rewards.solved says) once
        the page ended the episode: a step that does nothing reads them, as every step does."""
        observation = self.act("noop(0)")
        raw = observation.metadata["raw_reward"]
        return (
            observation.done,
            observation.reward,
            observation.metadata["browsergym_reward"],
            raw,
            rewards.solved(self.task, observation.done, observation.reward, raw),
        )

    def submit(self, label: str = "Submit") -> None:
        self.act(f"click('{find(self.tree, 'button', label)[0].bid}')")


# Sessions that play the audited pages side by side, a browser each: what the endings wait on is mostly the page
# (a timer that ends the episode, an animation, a refused action's 500 ms), not the CPU.
SESSIONS = 3


def scored_endings(session, task: str) -> list[tuple]:
    """Each seed's (seed, the wrong ending's scores, the right ending's), played in `session`."""
    played = []
    for seed in SEEDS_OF.get(task, SEEDS):
        endings = []
        for wrong in (True, False):
            ending = Ending(session, task, seed)
            ENDINGS[task](ending, wrong=wrong)
            endings.append(ending.scored())
        played.append((seed, *endings))
    return played


@pytest.fixture(scope="module")
def audited():
    """{task: its seeds' scored endings, or what playing them raised}, SESSIONS sequences of tasks side by side."""
    pool = browsers(SESSIONS)

    def play_in_order(tasks: list[str]) -> dict:
        results = {}
        with new_session(pool, reload_every=1) as session:
            for task in tasks:
                try:
                    results[task] = scored_endings(session, task)
                except Exception as error:  # this task's test raises it; the others' go on
                    results[task] = error
        return results

    return side_by_side(sorted(ENDINGS), play_in_order, SESSIONS)


# --- endings with the allowed actions -------------------------------------------------------------------------------


def asked_boxes(goal: str) -> set[str]:
    """The words a checkbox page's goal asks to select."""
    (listed,) = re.findall(r"Select (?:words similar to )?(.*) and click Submit", goal)
    return set(listed.split(", ")) if listed != "nothing" else set()


def checkbox_actions(tree: str, wanted: set[str], wrong: bool) -> list[str]:
    """A checkbox page's clicks: the `wanted` boxes (the first box flipped when `wrong`), then Submit."""
    boxes = find(tree, "checkbox")
    clicks = [box.bid for n, box in enumerate(boxes) if (box.name in wanted) != (wrong and n == 0)]
    return [f"click('{bid}')" for bid in [*clicks, find(tree, "button", "Submit")[0].bid]]


def checkboxes(ending: Ending, wrong: bool) -> None:
    """The expert's boxes, or all of them but one box flipped (most boxes right: a positive average)."""
    wanted = asked_boxes(ending.goal)
    if ending.task == "click-checkboxes-soft":
        wanted = set(
            ending.js(
                "(words) => [...document.querySelectorAll('label')].map((l) => l.textContent.trim())"
                ".filter((w) => SYNONYMS.some((g) => g.includes(w) && g.some((s) => words.includes(s))))",
                sorted(wanted),
            )
        )
    for action in checkbox_actions(ending.tree, wanted, wrong):
        ending.act(action)


def odd_or_even(ending: Ending, wrong: bool) -> None:
    """Each number marked, the last one wrongly when `wrong` (two of three right: an average of 1/3)."""
    tree = nodes(ending.tree)
    numbers = [int(n.name) for n in tree if n.role == "StaticText" and re.fullmatch(r"-?\d+", n.name)]
    odd, even = find(ending.tree, "button", "Odd"), find(ending.tree, "button", "Even")
    for row, number in enumerate(numbers):
        right_is_odd = number % 2 != 0
        pick_odd = right_is_odd != (wrong and row == len(numbers) - 1)
        ending.act(f"click('{(odd if pick_odd else even)[row].bid}')")
    ending.submit()


def colorwheel(ending: Ending, wrong: bool) -> None:
    """The asked colour typed into the picker's box, or the box's first colour left as it is."""
    if not wrong:
        asked = re.search(r"#([0-9a-fA-F]{6})", ending.goal)
        hex_colour = (
            asked.group(1) if asked else ending.js(f"() => ui_utils.colorNameToHex({ending.goal.split()[1]!r})")[1:]
        )
        ending.act(f"fill('{find(ending.tree, 'textbox')[0].bid}', {hex_colour!r})")
    ending.submit()


def phone_book(ending: Ending, wrong: bool) -> None:
    """The asked person's asked entry, or the same person's next entry (0.7 - 0.3 of the page's reward)."""
    (person,) = re.findall(r"Find (.*?) in the contact book", ending.goal)
    kinds = ["phone", "email", "address"]
    kind = next(k for k in kinds if k in ending.goal)
    while not find(ending.tree, "heading", person):
        ending.act(f"click('{find(ending.tree, 'link', '>')[0].bid}')")
    entries = [n for n in nodes(ending.tree) if n.role == "link" and n.bid][:3]  # the contact's phone, email, address
    ending.act(f"click('{entries[(kinds.index(kind) + wrong) % 3].bid}')")


def ascending_numbers(ending: Ending, wrong: bool) -> None:
    """The numbers clicked in order, or 1 then 3 (a fifth of the way: 0.2). After the first, the page hides the
    numbers behind boxes that keep their places."""
    first = "[...document.querySelectorAll('svg text')].find((t) => t.textContent === '1')"
    ending.click(
        *ending.js(
            f"() => {{ const r = {first}.getBoundingClientRect(); return [r.x + r.width / 2, r.y + r.height / 2]; }}"
        )
    )
    for number in [3] if wrong else [2, 3, 4, 5]:
        ending.click(*ending.center(f"rect[data-index='{number}']"))


def find_greatest(ending: Ending, wrong: bool) -> None:
    """The card with the greatest number, or the smallest (0.1 of the page's reward), then Submit."""
    index = ending.js(
        f"() => {{ const cards = [...document.querySelectorAll('.card')]; const values = cards.map("
        f"(c) => parseInt(c.textContent, 10)); return values.indexOf(Math.{'min' if wrong else 'max'}"
        "(...values)); }"
    )
    ending.click(*ending.center(f".card:nth-of-type({index + 1})"))
    ending.submit()


def drag_shapes_2(ending: Ending, wrong: bool) -> None:
    """Every shape to its box, or all but one (4 of 5: 0.84)."""
    asked = ending.goal
    placements = ending.js(
        """(asked) => {
      const shapes = [...document.querySelectorAll('svg rect:not(#shape-container), svg circle, svg polygon')]
        .filter((s) => !s.closest('defs') && s.getAttribute('fill') !== 'none');
      const kind = { circles: 'circle', rectangles: 'rect', triangles: 'polygon' };
      const colour = asked.match(/Drag all (\\w+) shapes/);
      const shape = asked.match(/Drag all (\\w+) into/);
      const boxes = [...document.querySelectorAll('#shape-container')].map((b) => b.getBoundingClientRect());
      return shapes.map((s) => {
        const r = s.getBoundingClientRect();
        const left = colour ? s.getAttribute('fill') === colour[1] : s.tagName.toLowerCase() === kind[shape[1]];
        const box = boxes[left ? 0 : 1];
        return [[r.x + r.width / 2, r.y + r.height / 2], [box.x + box.width / 2, box.y + box.height / 2]];
      });
    }""",
        asked,
    )
    for n, (start, target) in enumerate(placements):
        if wrong and n == 0:
            continue
        ending.drag([start, target])
    ending.submit()


def hot_cold(ending: Ending, wrong: bool) -> None:
    """A click where the page says HOT (within 5 pixels: 1.0), or where it says WARM (0.5). The page answers a
    pointer's every move with how near it is: swept in the page, its answers find both."""
    near = ending.js("""() => {
      const area = document.getElementById('touch-area').getBoundingClientRect(), found = {};
      for (let x = area.left + 1; x < area.right - 1; x += 1) for (let y = area.top + 1; y < area.bottom - 1; y += 1) {
        $('#touch-area').trigger($.Event('mousemove', { pageX: x, pageY: y }));
        const signal = document.getElementById('signal').className;
        if (!found[signal]) found[signal] = [x, y];
      }
      return found;
    }""")
    ending.click(*near["warm" if wrong else "hot"])


def draw_line(ending: Ending, wrong: bool) -> None:
    """A straight line of 80 pixels through the dot in the asked direction, or 12 pixels beside it (0.8 + 0.15). The
    page judges a line's direction by how far its last point lies from the mean of ten: a long line of few points."""
    x, y = ending.center("#circ")
    left, top, right, bottom = ending.js(
        "() => { const r = document.querySelector('svg').getBoundingClientRect(); "
        "return [r.left, r.top, r.right, r.bottom]; }"
    )
    off = 12 if wrong else 0
    if "horizontal" in ending.goal:  # pressed inside the drawing, or the page draws nothing
        start, end = max(left + 3, x - 40), min(right - 3, x + 40)
        points = [(start + (end - start) * k / 10, y + off) for k in range(11)]
    else:
        start, end = max(top + 3, y - 40), min(bottom - 3, y + 40)
        points = [(x + off, start + (end - start) * k / 10) for k in range(11)]
    ending.drag(points)
    ending.submit()


def draw_circle(ending: Ending, wrong: bool) -> None:
    """A round circle around the mark, or one too small (less than 20 pixels across: half the page's reward)."""
    x, y = ending.center("circle")
    radius = 7 if wrong else 30
    ending.drag(
        [(x + radius * math.cos(a / 24 * math.tau), y + radius * math.sin(a / 24 * math.tau)) for a in range(25)]
    )
    ending.submit()


def svg_point(ending: Ending, target: tuple[float, float]) -> None:
    """A click where the page puts its marker at `target` (the page draws it at the pointer, less its 50-pixel
    query, and compares bounding boxes of 3.5-pixel circles)."""
    x, y = target
    ending.click(x + 3.5, y + 3.5 + 50)


def circle_center(ending: Ending, wrong: bool) -> None:
    """The circle's centre, or half its radius away from it (0.5)."""
    cx, cy, r = ending.js(
        "() => { const c = [...document.querySelectorAll('svg circle')].find((e) => !e.classList.length"
        " || !['blue', 'green'].includes(e.getAttribute('class'))); "
        "return ['cx', 'cy', 'r'].map((a) => parseFloat(c.getAttribute(a))); }"
    )
    offset = r / 2 if wrong else 0
    svg_point(ending, (cx + offset - 3.5, cy - 3.5))
    ending.submit()


def find_midpoint(ending: Ending, wrong: bool) -> None:
    """The midpoint, or 10 pixels off it (2/3)."""
    (ax, ay), (bx, by) = ending.js(
        "() => [...document.querySelectorAll('.black-circle')].map((c) => { "
        "const b = c.getBBox(); return [b.x, b.y]; })"
    )
    svg_point(ending, ((ax + bx) / 2 + (10 if wrong else 0), (ay + by) / 2))
    ending.submit()


def angle_point(ending: Ending, wrong: bool) -> None:
    """A point on the bisector of the angle (bisect-angle) or at a right angle to the line (right-angle), or turned
    off it: by a quarter of the angle (bisect-angle: 0.5), or 15 degrees (right-angle: 0.67)."""
    vertex_class = ".init-blue" if ending.task == "bisect-angle" else "#init-blue"
    arms = ".init-black" if ending.task == "bisect-angle" else "#init-black"
    (vx, vy), *points = ending.js(
        f"() => [...document.querySelectorAll('{vertex_class}, {arms}')]"
        ".sort((a, b) => (a.matches('"
        + vertex_class
        + "') ? -1 : 1) - (b.matches('"
        + vertex_class
        + "') ? -1 : 1)).map((c) => { const b = c.getBBox(); return [b.x, b.y]; })"
    )
    angles = [math.atan2(py - vy, px - vx) for px, py in points]
    if ending.task == "bisect-angle":
        a, b = angles
        direction = math.atan2(math.sin(a) + math.sin(b), math.cos(a) + math.cos(b))
    else:
        direction = angles[0] + math.pi / 2
        probe = (vx + 30 * math.cos(direction), vy + 30 * math.sin(direction))
        if not (5 <= probe[0] <= 140 and 5 <= probe[1] <= 120):
            direction -= math.pi
    if wrong and ending.task == "bisect-angle":
        (ax, ay), (bx, by) = ((px - vx, py - vy) for px, py in points)
        direction += math.acos((ax * bx + ay * by) / math.hypot(ax, ay) / math.hypot(bx, by)) / 4
    elif wrong:
        direction += math.radians(15)
    svg_point(ending, (vx + 30 * math.cos(direction), vy + 30 * math.sin(direction)))
    ending.submit()


ENDINGS = {
    "ascending-numbers": ascending_numbers,
    "bisect-angle": angle_point,
    "circle-center": circle_center,
    "click-checkboxes": checkboxes,
    "click-checkboxes-large": checkboxes,
    "click-checkboxes-soft": checkboxes,
    "click-checkboxes-transfer": checkboxes,
    "drag-shapes-2": drag_shapes_2,
    "draw-circle": draw_circle,
    "draw-line": draw_line,
    "find-greatest": find_greatest,
    "find-midpoint": find_midpoint,
    "hot-cold": hot_cold,
    "odd-or-even": odd_or_even,
    "phone-book": phone_book,
    "right-angle": angle_point,
    "use-colorwheel": colorwheel,
    "use-colorwheel-2": colorwheel,
}


@pytest.mark.slow
@pytest.mark.parametrize("task", sorted(ENDINGS))
def test_a_wrong_ending_the_page_pays_scores_zero_and_the_right_one_one(audited, task):
    if isinstance(audited[task], Exception):
        raise audited[task]
    for seed, wrong, right in audited[task]:
        done, reward, browsergym, raw, solved = wrong
        assert done and raw > 0 and browsergym == 1.0, (task, seed, "the trap: the page pays", raw)
        assert (solved, reward) == (False, 0.0), (task, seed, raw)
        done, reward, browsergym, raw, solved = right
        assert done and solved and (reward, browsergym) == (1.0, 1.0), (task, seed, raw)


class WireEnding(Ending):
    """The same through the server's wire, by OpenEnv's public client, with the allowed actions alone: what any
    client of the server sees."""

    FIELDS = ("goal", "axtree_txt", "pruned_html")

    def __init__(self, client, task: str, seed: int):
        self.client, self.task = client, task
        first = client.reset(task_name=task, seed=seed, fields=list(self.FIELDS)).observation
        self.goal, self.tree, self.html = first["goal"], first["axtree_txt"], first["pruned_html"]

    def act(self, action: str):
        result = self.client.step({"action_str": action})
        self.tree, self.html = result.observation["axtree_txt"], result.observation["pruned_html"]
        return result

    def scored(self) -> tuple[bool, float, float, float, bool]:
        result = self.act("noop(0)")
        metadata = result.observation["metadata"]
        raw = metadata["raw_reward"]
        solved = rewards.solved(self.task, result.done, result.reward, raw)
        return result.done, result.reward, metadata["browsergym_reward"], raw, solved


def find_greatest_by_actions(ending: WireEnding, wrong: bool) -> None:
    """find-greatest's cards are not in the accessibility tree, but their bids are on the page (`pruned_html`): the
    card with the greatest number, or the smallest (0.1 of the page's reward), then Submit."""
    cards = re.findall(r'bid="(\d+)" class="card hidden"[^>]*>\s*<span[^>]*>\s*(-?\d+)', ending.html)
    assert len(cards) == 3, ending.html
    pick = (min if wrong else max)(cards, key=lambda card: int(card[1]))
    ending.act(f"click('{pick[0]}')")
    ending.submit()


# The audited pages whose wrong and right endings the allowed actions reach, as any client of the server plays them.
BY_ACTIONS = {
    "click-checkboxes": checkboxes,
    "click-checkboxes-large": checkboxes,
    "click-checkboxes-transfer": checkboxes,
    "find-greatest": find_greatest_by_actions,
    "odd-or-even": odd_or_even,
    "phone-book": phone_book,
}


@pytest.mark.parametrize("task", sorted(BY_ACTIONS))
def test_through_the_wire_a_wrong_ending_the_page_pays_is_rewarded_zero_for_every_client(env_server, task):
    """OpenEnv's public client plays each wrong ending and each right one: the server's reward is 0.0 and 1.0, what
    rewards.solved says; BrowserGym's score (1.0 for both) and the page's raw reward are in the metadata."""
    with GenericEnvClient(base_url=env_server.url).sync() as client:
        for seed in (0, 1):
            wrong = WireEnding(client, task, seed)
            BY_ACTIONS[task](wrong, wrong=True)
            done, reward, browsergym, raw, solved = wrong.scored()
            assert done and 0 < raw < 1 and browsergym == 1.0, (task, seed, "the trap: the page pays", raw)
            assert (reward, solved) == (0.0, False), (task, seed, raw)
            right = WireEnding(client, task, seed)
            BY_ACTIONS[task](right, wrong=False)
            assert right.scored() == (True, 1.0, 1.0, pytest.approx(1.0), True), (task, seed)


def test_the_audit_lists_every_page_that_computes_its_reward_and_the_threshold_rewards_py_uses():
    """docs/reward_audit.md: the 18 pages played above, each with the rule rewards.solved applies, and the 7 other
    pages that compute a reward, which together are every page bench/reward_audit.py finds computing one."""
    audit = (ROOT / "docs" / "reward_audit.md").read_text()
    paying, quiet = audit.split("## The 18 pages")[1].split("## The 7 pages")
    rows = re.findall(r"^\| `([\w-]+)` \|.*\| raw (= 1|≥ 0\.9) \|", paying, re.M)
    assert sorted(task for task, _ in rows) == sorted(ENDINGS)
    assert {task for task, rule in rows if rule == "≥ 0.9"} == set(scoring.CLOSE_ENOUGH)
    others = set(re.findall(r"`([\w-]+)`", quiet.split("MiniWoB pages outside")[0]))

    audit = subprocess.run(
        [sys.executable, "bench/reward_audit.py", "--computed"], cwd=ROOT, capture_output=True, text=True, check=True
    )
    computed = audit.stdout.splitlines()[-1].split("read by hand: ")[1].split(", ")
    assert set(computed) == set(ENDINGS) | others


def test_a_partial_credit_ending_scores_zero_in_every_consumer_and_the_right_ending_one(env_server, tokenizer):
    """click-checkboxes played by the recipe's own rollout, one seed twice: all boxes but one right (the page pays
    part of its reward) and all right. The rollout records the page's raw reward, and the training reward (what the
    rollout hands GRPO's step), the curriculum's success estimate, the step's per-task figures and evaluate.py's
    records each score the wrong ending 0 and the right one 1; BrowserGym's scoring, reported beside, pays both."""
    seed = 0

    def policy(episodes):
        if not playing:  # the first turn's batch: both episodes, in the order run() was given them
            playing.update({id(e): wrong for e, wrong in zip(episodes, (True, False), strict=True)})
        replies = []
        for e in episodes:
            first = e.first_observation
            actions = checkbox_actions(first.axtree_txt, asked_boxes(first.goal), playing[id(e)])
            replies.append(reply_of_text(tokenizer, actions[e.turns]))
        return replies

    playing = {}
    runner = EpisodeRunner(ServerPool([env_server.url]), tokenizer, EpisodeSettings(max_turns=10), lockstep=True)
    try:
        wrong, right = runner.run([("click-checkboxes", seed)] * 2, policy)
    finally:
        runner.close()

    assert wrong.done and 0 < wrong.raw_reward < 1 and right.raw_reward == pytest.approx(1.0)
    assert (wrong.env_reward, right.env_reward) == (0.0, 1.0)
    assert (wrong.solved, right.solved) == (False, True)
    trained = rewards.task_success(
        [None, None],
        env_task=[wrong.task_name, right.task_name],
        env_done=[wrong.done, right.done],
        env_reward=[wrong.env_reward, right.env_reward],
        env_raw_reward=[wrong.raw_reward, right.raw_reward],
    )
    assert trained == [0.0, 1.0]
    estimates = []
    for episode in (wrong, right):
        sampler = TaskSampler({"click-checkboxes": 1.0}, curriculum=True)
        sampler.update("click-checkboxes", [episode.outcome().solved])  # train.py updates it from the outcomes
        estimates.append(sampler.success["click-checkboxes"])
    assert estimates[0] < 0.5 < estimates[1]  # from the unknown task's 0.5: down for the wrong ending, up for the right
    figures = [episode_metrics([e.outcome()])["tasks/click-checkboxes/success_rate"] for e in (wrong, right)]
    assert figures == [0.0, 1.0]
    records = [episode_record(wrong), episode_record(right)]
    assert [(r["success"], r["browsergym_success"]) for r in records] == [(False, True), (True, True)]
    summary = summarize(records)
    assert (summary["solved"], summary["browsergym_solved"]) == (1, 2)
