"""What keeping each episode's cache from its previous turn saves an evaluation on a CPU: the same episodes played
with evaluate.py's generation (browser_rl.generation.TurnCachedGeneration: each context on its own, going on from
its cache) and with one batched `generate` a turn that prefills every episode's whole stream again (model_generate,
the way before it), one after the other on the same server, greedy. Per way: the wall time of the episodes, and
whether the two ways' replies are the same token for token.

    python bench/turn_cache.py                          # the real model, 8 of the test split's tasks, 10 turns
    python bench/turn_cache.py --tasks click-test enter-text --max_turns 2

Run it on an otherwise idle machine: the rows are compared with each other.
"""

import argparse
import json
import time
from pathlib import Path

from browser_rl.episode_settings import EpisodeSettings
from browser_rl.generation import cached_generate, load_policy, model_generate
from browser_rl.rollout import EpisodeRunner, model_policy
from browser_rl.servers import ServerPool
from env_client import LocalEnvServer

ROOT = Path(__file__).resolve().parents[1]
# Tasks of BrowserGym's test split whose pages run long, so that the streams do.
TASKS = [
    "book-flight",
    "click-checkboxes-soft",
    "email-inbox-forward-nl",
    "login-user-popup",
    "search-engine",
    "social-media-all",
    "use-autocomplete",
    "click-tab-2-hard",
]


def play(runner: EpisodeRunner, instances: list, way: str, generate, max_context_tokens: int) -> tuple[float, list]:
    start = time.perf_counter()
    episodes = runner.run(instances, model_policy(generate), max_context_tokens)
    seconds = time.perf_counter() - start
    print(f"{way}: {len(episodes)} episodes in {seconds:.0f} s", flush=True)
    return seconds, episodes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=str(ROOT / ".cache" / "smollm2-135m-instruct"))
    parser.add_argument("--tasks", nargs="+", default=TASKS, help="one episode of each, seed 0, played at once")
    parser.add_argument("--max_turns", type=int, default=10)
    parser.add_argument("--max_new_tokens", type=int, default=32)
    parser.add_argument("--output", type=Path, default=ROOT / "outputs" / "turn_cache.json")
    args = parser.parse_args()

    model, tokenizer = load_policy(args.model)
    instances = [(task, 0) for task in args.tasks]
    settings = EpisodeSettings(max_turns=args.max_turns)
    max_context_tokens = model.config.max_position_embeddings - args.max_new_tokens
    with LocalEnvServer(max_sessions=len(instances)) as server:
        runner = EpisodeRunner(ServerPool([server.url]), tokenizer, settings)
        try:
            whole = model_generate(model, tokenizer, 0, args.max_new_tokens)
            batched_s, batched = play(runner, instances, "batched generate", whole, max_context_tokens)
            cached = cached_generate(model, tokenizer, 0, args.max_new_tokens)
            cached_s, with_cache = play(runner, instances, "turn cache", cached, max_context_tokens)
        finally:
            runner.close()
    result = {
        "model": args.model,
        "episodes": len(instances),
        "turns": sum(episode.turns for episode in with_cache),
        "stream_tokens_at_the_end": sum(len(episode.context()) for episode in with_cache),
        "batched_generate_s": round(batched_s, 1),
        "turn_cache_s": round(cached_s, 1),
        "time_ratio": round(cached_s / batched_s, 3),
        "same_replies": [e.completion_ids for e in batched] == [e.completion_ids for e in with_cache],
    }
    print(json.dumps(result, indent=2))
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
