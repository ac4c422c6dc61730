"""Play a trained agent on one task, step by step, each action printed; the episode's trace and viewer written.

    python run_agent.py --model outputs/smollm2-page-reading --task_name click-tab --seed 1000003
    python run_agent.py --model agent.gguf --task_name login-user --dry_run      # asks before each action
    python run_agent.py --model agent.gguf --task_name login-user --headed       # in a browser window
    python run_agent.py --model http://localhost:8000 --task_name click-tab      # a model `vllm serve` serves
    python run_agent.py --model outputs/workflows --task_modules workflows/clinic/clinic_task.py --task_name book-clinic
    python run_agent.py --model outputs/workflows --url http://127.0.0.1:5000/ --goal "Book the earliest slot."

The agent (browser_rl.agent) plays with the episode settings it was trained with; --max_steps allows it more or fewer
actions. The trace and OUTPUT_DIR/viewer.html, which shows every episode played into OUTPUT_DIR, are browser_rl.traces'.
"""

import contextlib
import functools
import logging
import os
from dataclasses import replace
from pathlib import Path

from browser_rl import episode_settings
from browser_rl.agent import Agent, load_agent
from browser_rl.command_line import parse_command_line, run_command
from browser_rl.command_options import AgentArguments
from browser_rl.episode import Episode, reply_action
from browser_rl.errors import UsageError
from browser_rl.options import EpisodeArguments, ServerArguments, TaskArguments
from browser_rl.rollout import EpisodeRunner, Policy
from browser_rl.servers import open_server_pool
from browser_rl.traces import TRACES_DIR, episode_trace, write_trace, write_viewer
from env_client import LocalEnvServer
from web_env import task_modules
from web_env.display import missing_display

OPTIONS = (AgentArguments, TaskArguments, EpisodeArguments, ServerArguments)
# The task of --url, a task module like any other: loaded by name, in this process and in the server's.
URL_TASK = "web_env.url_task"
log = logging.getLogger("run_agent")


class Stopped(Exception):
    """The user declined an action in a dry run: the episode ends there."""


def stepping(policy: Policy, agent: Agent, dry_run: bool, ask=input) -> Policy:
    """The policy, printing each step's action (and the error of the one before) and, in a dry run, asking first."""

    def policy_stepping(episodes: list[Episode]) -> list:
        (episode,) = episodes
        print_last_error(episode)
        (reply,) = policy(episodes)
        text, action = reply_action(agent.tokenizer, reply)
        print(f"step {episode.turns + 1}: {action or f'no action in the reply {text!r}'}", flush=True)
        if dry_run and action is not None and ask("do it? [Y/n] ").strip().lower() in ("n", "no", "q"):
            raise Stopped
        return [reply]

    return policy_stepping


def steps(count: int) -> str:
    return f"{count} step{'s' * (count != 1)}"


def print_last_error(episode: Episode) -> None:
    if episode.errors and episode.errors[-1]:
        print(f"         error: {episode.errors[-1].splitlines()[0]}")  # Playwright's call log follows


def settings_to_play(agent: Agent, given: EpisodeArguments, max_steps: int | None) -> episode_settings.EpisodeSettings:
    """The settings the agent was trained with (the defaults, said so, for a model saved without them), with at most
    max_steps actions: the prompt does not say how many it has."""
    settings = episode_settings.resolve(given, agent.made_with, agent.name).settings
    if agent.made_with is None:
        log.warning("%s has no saved episode settings: playing with %s", agent.name, settings.describe())
    return replace(settings, max_turns=max_steps) if max_steps else settings


def play_episode(runner: EpisodeRunner, instance: tuple[str, int], policy: Policy, agent: Agent) -> Episode | None:
    """The episode, traced; None when the user stopped it in a dry run."""
    try:
        return runner.run([instance], policy, agent.max_context_tokens, traced=True)[0]
    except* Stopped:
        pass
    return None


def on_a_url(args: AgentArguments, tasks: TaskArguments, servers: ServerArguments) -> TaskArguments:
    """The task of --url and --goal (web_env.url_task), which the server this command starts serves."""
    if servers.env_url:
        raise UsageError("--url is played by a server this command starts: leave env_url out")
    os.environ.update({"BROWSER_RL_URL": args.url, "BROWSER_RL_GOAL": args.goal})  # what the module reads
    (task,) = task_modules.load([URL_TASK])
    return replace(tasks, task_name=task, task_modules=[*tasks.task_modules, URL_TASK])


def windowed_server(servers: ServerArguments):
    """A server whose browser shows its window: one this command starts, on a display."""
    if servers.env_url:
        raise UsageError("--headed shows the window of a browser this command starts: leave env_url out")
    if no_window := missing_display():
        raise UsageError(f"--headed: {no_window}")
    return functools.partial(LocalEnvServer, server_args=["--headed"])


def main() -> None:
    args, tasks, episodes, servers = parse_command_line(OPTIONS, from_file=OPTIONS[1:])
    if tasks.tasks:
        raise UsageError("run_agent.py plays one task: name it with --task_name")
    new_server = windowed_server(servers) if args.headed else LocalEnvServer
    if args.url:
        tasks = on_a_url(args, tasks, servers)
    agent = load_agent(args.model, "--model", args.temperature, args.max_new_tokens, args.tokenizer)
    settings = settings_to_play(agent, episodes, args.max_steps)
    print(f"{agent.name} plays {args.url or tasks.task_name}, seed {args.seed}, at most {steps(settings.max_turns)}")
    with contextlib.ExitStack() as stack:
        pool = open_server_pool(stack, servers, 1, tasks.task_modules, new_server)
        runner = EpisodeRunner(pool, agent.tokenizer, settings, max_env_failures=servers.max_env_failures)
        stack.callback(runner.close)
        episode = play_episode(
            runner, (tasks.task_name, args.seed), stepping(agent.policy(), agent, args.dry_run), agent
        )
    if episode is None:
        print("stopped: the action was not taken")
        return
    print_last_error(episode)
    outcome = "ended (a URL has no checker)" if args.url else "solved" if episode.solved else "not solved"
    print(f"{outcome} after {steps(episode.turns)}")
    trace = episode_trace(episode, settings.max_page_chars, f"{agent.name}, seed {args.seed}")
    write_trace(trace, Path(args.output_dir, TRACES_DIR, tasks.task_name, f"seed-{args.seed}.json"))
    print(f"trace: {write_viewer(Path(args.output_dir), f'{agent.name}: run_agent.py')}")


if __name__ == "__main__":
    run_command("run_agent.py", main)
