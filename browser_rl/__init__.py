"""The recipe's own parts, on the trainer's side: what a run reads (options.py, command_line.py, episode_settings.py),
how it plays episodes (rollout.py: the token stream with env_mask; prompts.py, generation.py, servers.py, tasks.py),
what it reports (metrics.py), how it trains (trainer.py, sft_phases.py), how a model is measured (evaluation.py), and
how it fails (errors.py). train.py and evaluate.py at the top level wire them."""
