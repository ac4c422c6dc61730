"""Which action reference a real model acts from, and what each costs: SmolLM2-135M-Instruct's replies to click-test's
first pages under BrowserGym's own reference (prompt version 1) and under the compact one the recipe shows now
(web_env.actions.describe_actions, prompt version 2). Per reference: the system prompt's tokens, and of the replies,
the share with a valid action and the share with the right one, greedy and sampled at temperature 1.

    python bench/action_reference.py                    # 16 seeds, 4 samples each: a few minutes on 2 cores
    python bench/action_reference.py --model outputs/smollm2-warm-up

The only difference between the two prompts is the reference: both are rendered by browser_rl.prompts' ChatTurns.
"""

import argparse
import json
from pathlib import Path

import torch

from browser_rl import prompts
from browser_rl.generation import load_policy, model_generate
from browser_rl.prompts import ChatTurns
from env_client import BrowserGymEnv, LocalEnvServer
from warm_start.plans import plan
from web_env.actions import ACTION_SET, describe_actions, parse_action

ROOT = Path(__file__).resolve().parents[1]
INTRO = prompts.SYSTEM_PROMPT.removesuffix(describe_actions())
REFERENCES = {
    "BrowserGym's (version 1)": INTRO + ACTION_SET.describe(with_long_description=False, with_examples=True),
    "compact (version 2)": prompts.SYSTEM_PROMPT,
}


def first_observations(seeds: range) -> list:
    with LocalEnvServer(max_sessions=1) as server, BrowserGymEnv(base_url=server.url).sync() as session:
        return [session.reset(task_name="click-test", seed=seed).observation for seed in seeds]


def shares(model, tokenizer, observations: list, system_prompt: str, temperature: float, samples: int) -> dict:
    """The share of replies with a valid action and with the right one, over `samples` replies to each page."""
    prompts.SYSTEM_PROMPT = system_prompt  # ChatTurns renders the module's system prompt
    chat = ChatTurns(tokenizer, max_page_chars=2000)
    generate = model_generate(model, tokenizer, temperature, max_new_tokens=32)
    valid = right = total = 0
    for observation in observations:
        replies = generate([chat.first_prompt(observation)] * samples)
        (right_action,) = plan("click-test", observation.goal, observation.axtree_txt).right
        for reply in replies:
            action = parse_action(tokenizer.decode(reply.ids, skip_special_tokens=True)) if reply.ended else None
            valid += action is not None
            right += action == right_action
            total += 1
    return {"valid_action_share": valid / total, "right_action_share": right / total, "replies": total}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=str(ROOT / ".cache" / "smollm2-135m-instruct"))
    parser.add_argument("--seeds", type=int, default=16)
    parser.add_argument("--samples", type=int, default=4, help="replies per page at temperature 1")
    parser.add_argument("--output", type=Path, default=ROOT / "outputs" / "action_reference.json")
    args = parser.parse_args()
    torch.manual_seed(0)
    model, tokenizer = load_policy(args.model)
    observations = first_observations(range(1_000_000, 1_000_000 + args.seeds))
    results = {}
    for name, system_prompt in REFERENCES.items():
        results[name] = {
            "system_prompt_tokens": len(tokenizer.encode(system_prompt, add_special_tokens=False)),
            "greedy": shares(model, tokenizer, observations, system_prompt, 0.0, 1),
            "temperature 1": shares(model, tokenizer, observations, system_prompt, 1.0, args.samples),
        }
        print(name, json.dumps(results[name]), flush=True)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps({"model": args.model, "seeds": args.seeds, **results}, indent=2) + "\n")


if __name__ == "__main__":
    main()
