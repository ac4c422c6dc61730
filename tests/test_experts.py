"""The scripted experts (warm_start.experts): each solves its task on a few held-out seeds, reading only what the
policy reads, and their demonstrations are what a warm-up learns from. bench/expert_success.py measures them on 100
seeds each (docs/experts.md)."""

from contextlib import closing

import pytest

from browser_rl import episode_settings
from browser_rl.command_line import parse_command_line
from browser_rl.episode_settings import EpisodeSettings
from browser_rl.options import EpisodeArguments
from browser_rl.rollout import EpisodeRunner
from browser_rl.servers import ServerPool
from browser_rl.tasks import browsergym_split_of
from helpers import ROOT
from warm_start.experts import EXPERTS
from warm_start.page_tree import nodes
from warm_start.record import record_experts
from web_env.models import miniwob_name

SEEDS = range(3_000_100, 3_000_102)  # held out: apart from training's, evaluation's and recorded demonstrations'


def test_the_experts_cover_book_flight_and_twenty_train_split_tasks_of_eight_similarity_groups():
    from browsergym.experiments.benchmark.metadata.utils import task_metadata

    group = {miniwob_name(row.task_name): row.similarity_group for row in task_metadata("miniwob").itertuples()}
    train = [task for task in EXPERTS if browsergym_split_of()[task] == "train"]
    assert {"book-flight", "book-flight-nodelay"} <= set(train)
    others = [task for task in train if not task.startswith("book-flight")]
    assert len(others) >= 20 and len({group[task] for task in others}) >= 8


def test_a_page_line_reads_as_its_bid_role_name_and_value():
    (box,) = nodes("Page:\n\t[19] textbox 'From:' value='Santa Ana, CA (SNA)', focused")
    assert (box.depth, box.bid, box.role, box.name, box.value()) == (1, "19", "textbox", "From:", "Santa Ana, CA (SNA)")


def recipe_settings(config: str) -> EpisodeSettings:
    (given,) = parse_command_line([EpisodeArguments], ["--config", config])
    return episode_settings.resolve(given, None, config).settings


@pytest.mark.slow
@pytest.mark.parametrize(
    "tasks, settings",
    [
        # book-flight's recipe records its demonstrations at its limits (docs/experts.md: at most 12 actions)
        (["book-flight", "book-flight-nodelay"], recipe_settings(str(ROOT / "configs/warm_up/book_flight.yaml"))),
        (["book-flight-nodelay"], recipe_settings(str(ROOT / "configs/warm_up/book_flight_cpu.yaml"))),
        # the others have no recipe: docs/experts.md's wide table's limits
        ([t for t in sorted(EXPERTS) if not t.startswith("book-flight")], EpisodeSettings(15, 4000)),
    ],
    ids=["book-flight, GPU recipe", "book-flight, CPU recipe", "the others"],
)
def test_each_expert_solves_its_task_reading_the_page_as_the_prompt_cuts_it(env_server, tokenizer, tasks, settings):
    instances = [(task, seed) for task in tasks for seed in SEEDS]
    with closing(EpisodeRunner(ServerPool([env_server.url]), tokenizer, settings)) as runner:
        played = record_experts(runner, instances, EXPERTS)
    unsolved = [(d.task, d.seed, [turn.reply for turn in d.turns]) for d in played if not d.solved]
    assert unsolved == []
