"""Episodes in lock step against episodes that advance on their own, side by side on the same seeds and servers.

    python bench/rollout_scheduling.py                       # 96 login-user episodes each way, 16 at a time
    python bench/rollout_scheduling.py --episodes 192 --batch 32 --env_servers 2

In lock step every turn's generation waits for the slowest browser of the turn before, and every browser step
waits for the whole batch's generation. Otherwise (rollout.ReplyBatcher) an episode's next context joins the
next generation as soon as its browser answers. login-user takes three actions (two fields, one click), so
every episode goes back and forth between generation and its browser.

Two generators, each run both ways:
- "tiny LFM2 on this CPU": a tiny LFM2 fine-tuned here to fill login-user's fields (scripted right replies, so
  every reply is an action), sampling with a fixed seed. Generation takes the same cores as the browsers.
- "GPU-paced": stands in for a GPU's batched generate at the hardware boundary: the scripted right action
  for each context, after the latency measured on an H100 with an LFM2-350M-shaped model (0.7 s for a batch
  of 8 contexts, 1.0 s for 256, 32 tokens), spent asleep, as the host's cores are while a GPU works.
The script prints episodes and turns per second and the whole machine's CPU use for each, and the ratios.
Run it on an otherwise idle machine.
"""

import argparse
import os
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

import psutil
import torch

from env_client import LocalEnvServer, ServerPool
from evaluate import load_policy, model_generate
from metrics import setup_logging
from rollout import EpisodeRunner, GenerateFn, Reply
from scripted_policy import episode_so_far, plan
from tiny_lfm2 import build_tiny_lfm2
from warm_up import right_only, warm_up

TASK = "login-user"


def h100_generate_seconds(batch: int) -> float:
    """Seconds of one batched generate of 32 tokens, interpolated between the two sizes measured on an H100."""
    return 0.7 + 0.3 * (batch - 8) / (256 - 8)


def gpu_paced_generate(tokenizer) -> GenerateFn:
    """The plan's next right action for each context, returned after an H100's generation latency."""

    def reply_to(context: list[int]) -> Reply:
        goal, pages, turn = episode_so_far(tokenizer.decode(context))
        actions = plan(TASK, goal, pages).right
        ids = tokenizer.encode(actions[min(turn, len(actions) - 1)], add_special_tokens=False)
        return Reply(ids=ids + [tokenizer.eos_token_id], logprobs=[0.0] * (len(ids) + 1), ended=True)

    def generate(contexts: list[list[int]]) -> list[Reply]:
        time.sleep(h100_generate_seconds(len(contexts)))
        return [reply_to(context) for context in contexts]

    return generate


def busy_cpu_seconds() -> float:
    times = psutil.cpu_times()
    return times.user + times.nice + times.system + times.irq + times.softirq


def play(servers: ServerPool, tokenizer, generate: GenerateFn, args, lockstep: bool) -> dict:
    """Episodes and turns per second and the machine's CPU use (in cores), over all the batches."""
    torch.manual_seed(0)
    runner = EpisodeRunner(servers, tokenizer, max_turns=args.max_turns, lockstep=lockstep)
    try:
        runner.run([(TASK, seed) for seed in range(args.batch)], generate)  # sessions open, pages warm
        cpu, start, turns, solved = busy_cpu_seconds(), time.perf_counter(), 0, 0
        for first in range(0, args.episodes, args.batch):
            episodes = runner.run([(TASK, seed) for seed in range(first, first + args.batch)], generate)
            turns += sum(episode.turns for episode in episodes)
            solved += sum(episode.solved for episode in episodes)
        wall = time.perf_counter() - start
        return {"episodes/s": args.episodes / wall, "turns/s": turns / wall, "turns": turns / args.episodes,
                "solved": solved / args.episodes, "cores": (busy_cpu_seconds() - cpu) / wall}  # fmt: skip
    finally:
        runner.close()


def report(name: str, results: dict) -> None:
    print(f"\n{name}:")
    for schedule, r in results.items():
        print(f"  {schedule:<13} {r['episodes/s']:5.2f} episodes/s  {r['turns/s']:5.2f} turns/s  "
              f"{r['turns']:.1f} turns each  solved {r['solved']:4.0%}  CPU {r['cores']:.2f} cores busy")  # fmt: skip
    on_their_own, lock_step = results["on their own"], results["lock step"]
    print(f"  on their own / lock step: x{on_their_own['episodes/s'] / lock_step['episodes/s']:.2f} episodes per "
          f"second, x{on_their_own['turns/s'] / lock_step['turns/s']:.2f} turns per second")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--episodes", type=int, default=96)
    parser.add_argument("--batch", type=int, default=16, help="episodes played at once")
    parser.add_argument("--max_turns", type=int, default=5)
    parser.add_argument("--env_servers", type=int, default=1)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch, ExitStack() as stack:
        servers = [stack.enter_context(LocalEnvServer(TASK, max_sessions=args.batch)) for _ in range(args.env_servers)]
        base = str(build_tiny_lfm2(Path(scratch) / "tiny-lfm2"))
        policy = warm_up(base, Path(scratch) / "filling", servers[0].url, [TASK], right_only, 60, 8, 3e-3)
        model, tokenizer = load_policy(policy)
        pool = ServerPool(servers)
        generators = {
            "tiny LFM2 on this CPU": model_generate(model, tokenizer, temperature=1.0, max_new_tokens=32),
            "GPU-paced (an H100's measured latency, scripted replies)": gpu_paced_generate(tokenizer),
        }
        results = {
            name: {schedule: play(pool, tokenizer, generate, args, lockstep)
                   for schedule, lockstep in (("lock step", True), ("on their own", False))}
            for name, generate in generators.items()
        }  # fmt: skip
    print(f"\n{args.episodes} {TASK} episodes of up to {args.max_turns} turns, {args.batch} at a time, "
          f"{args.env_servers} environment server(s), {os.cpu_count()} CPU cores")  # fmt: skip
    for name, by_schedule in results.items():
        report(name, by_schedule)


if __name__ == "__main__":
    setup_logging()
    main()
