import hashlib
import logging
import re
import subprocess
import sys
import warnings

import pytest
import torch
import yaml
from peft import get_peft_model
from transformers import AutoModelForCausalLM
from trl import get_peft_config

import evaluate as evaluate_py
import train
from browser_rl.command_line import Parser, parse_command_line
from browser_rl.errors import ConfigError
from browser_rl.model_source import missing_model, resolve_model
from browser_rl.options import ModelOptions
from browser_rl.tasks import PRESETS, preset_tasks
from helpers import ROOT, parse_config
from train import seed_dataset
from warm_start import record, warm_up
from warm_start.tiny_lfm2 import build_tokenizer


def parse_args(args: list[str]) -> tuple:
    return parse_command_line(train.OPTIONS, args)


LFM2_LINEAR_LAYERS = {"q_proj", "k_proj", "v_proj", "out_proj", "in_proj", "w1", "w2", "w3"}


def test_the_recipe_config_loads_with_its_real_settings():
    tasks, episodes, servers, _, training_args, model_args = parse_config("config.yaml")
    assert model_args.model_name_or_path == "LiquidAI/LFM2-350M"
    assert tasks.task_name == "click-test" and servers.env_url == [] and episodes.max_turns == 10
    assert training_args.num_generations == 8 and training_args.vllm_mode == "colocate"
    assert training_args.generation_batch_size == 256  # episodes per step (docs/environment.md, "Sizing")
    assert tasks.num_task_seeds == 1000
    assert set(model_args.lora_target_modules) == LFM2_LINEAR_LAYERS
    assert not model_args.use_peft  # full fine-tune unless --use_peft


@pytest.mark.parametrize(
    "config", ["config.yaml", *(f"configs/{path.name}" for path in (ROOT / "configs").glob("*.yaml"))]
)
def test_a_shipped_config_sets_no_deprecated_option(config):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        parse_config(config)
    deprecations = [str(w.message) for w in caught if issubclass(w.category, (DeprecationWarning, FutureWarning))]
    assert deprecations == []


@pytest.mark.parametrize(
    "config", [f"configs/warm_up/{path.name}" for path in (ROOT / "configs/warm_up").glob("*.yaml")]
)
def test_a_shipped_warm_up_config_parses_and_sets_no_deprecated_option(config):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        args, _, sft_config, model_args = parse_command_line(warm_up.OPTIONS, ["--config", str(ROOT / config)])
    deprecations = [str(w.message) for w in caught if issubclass(w.category, (DeprecationWarning, FutureWarning))]
    assert deprecations == []
    assert args.demonstrations and model_args.model_name_or_path and sft_config.completion_only_loss


@pytest.mark.parametrize(
    "options, required",
    [(train.OPTIONS, []), (warm_up.OPTIONS, ["--demonstrations", "episodes.jsonl"])],
    ids=["train", "warm_up"],
)
def test_a_config_without_activation_checkpointing_warns_of_nothing_and_keeps_trls_default(options, required):
    """TRL defaults the deprecated alias `gradient_checkpointing` to on; a user's config that leaves both unset must
    not print transformers' deprecation in every run, and the alias still turns it off."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        config = parse_command_line(options, required)[-2]
    assert [str(w.message) for w in caught if issubclass(w.category, FutureWarning)] == []
    assert config.activation_checkpointing is True
    config = parse_command_line(options, [*required, "--gradient_checkpointing", "false"])[-2]
    assert config.activation_checkpointing is False


def test_the_recipe_asks_for_colocated_vllm_on_the_gpu():
    recipe = yaml.safe_load((ROOT / "config.yaml").read_text())
    assert recipe["use_vllm"] is True and recipe["vllm_mode"] == "colocate" and recipe["bf16"] is True


def test_without_cuda_the_config_falls_back_to_transformers_and_says_so(caplog):
    with caplog.at_level(logging.WARNING, logger="train"):
        *_, training_args, _ = parse_config("config.yaml")
    cuda = torch.cuda.is_available()
    assert training_args.use_vllm is cuda and training_args.bf16 is cuda
    assert ("No CUDA device: generating with transformers instead of vLLM" in caplog.text) is not cuda


def heading_of(help_text: str, option: str) -> str:
    """The heading --help shows `option` under."""
    lines = help_text.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith(f"  --{option} "))
    return next(line for line in reversed(lines[:at]) if line and not line.startswith(" "))


@pytest.mark.parametrize(
    "types, headings",
    [
        (
            train.OPTIONS,
            ["tasks:", "episodes:", "environment servers:", "SFT phases", "training: TRL's GRPO", "model:"],
        ),
        (evaluate_py.OPTIONS, ["evaluation:", "tasks:", "episodes:", "environment servers:"]),
        (warm_up.OPTIONS, ["warm-up:", "episodes:", "training: TRL's SFTConfig", "model: TRL's ModelConfig"]),
    ],
)
def test_help_shows_each_option_group_under_its_heading_the_recipes_before_trls(types, headings):
    text = Parser(types, None).format_help()
    assert text.startswith("usage: ") and text.index("\n") < 120  # one line, not every option
    lines = text.splitlines()
    found = [next(i for i, line in enumerate(lines) if line.startswith(heading)) for heading in headings]
    assert found == sorted(found), headings
    assert heading_of(text, "max_turns").startswith("episodes:")
    if types == train.OPTIONS:
        assert heading_of(text, "learning_rate").startswith("training: TRL's GRPOConfig")
        assert heading_of(text, "trace_every").startswith("training: TRL's GRPOConfig")
        assert heading_of(text, "model_name_or_path").startswith("model: TRL's ModelConfig")
        assert heading_of(text, "informative_groups").startswith("tasks:")


def test_command_line_overrides_the_file():
    tasks, *_, training_args, model_args = parse_config(
        "config.yaml", "--task_name", "enter-text", "--max_steps", "7", "--use_peft", "--learning_rate", "1e-4"
    )
    assert (tasks.task_name, training_args.max_steps, model_args.use_peft) == ("enter-text", 7, True)
    assert training_args.learning_rate == 1e-4


def test_smoke_config_loads():
    *_, training_args, model_args = parse_config("configs/smoke.yaml")
    assert model_args.model_name_or_path == ".cache/smoke-start"
    assert training_args.generation_batch_size % training_args.num_generations == 0


def test_lora_targets_every_linear_layer_of_lfm2(tiny_model):
    *_, model_args = parse_config("config.yaml", "--use_peft")
    linear_layers = [
        name
        for name, module in AutoModelForCausalLM.from_pretrained(tiny_model).named_modules()
        if isinstance(module, torch.nn.Linear) and name != "lm_head"
    ]
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_model), get_peft_config(model_args))
    adapted = [name for name, module in model.named_modules() if hasattr(module, "lora_A")]
    assert {name.split(".")[-1] for name in adapted} == LFM2_LINEAR_LAYERS
    assert len(adapted) == len(linear_layers)  # every linear layer of every block, attention and convolution
    # The recipe's one LoRA default, where no target is named, for training and the warm-up alike.
    assert ModelOptions(model_name_or_path=tiny_model, use_peft=True).peft_config().target_modules == "all-linear"
    assert ModelOptions(model_name_or_path=tiny_model).peft_config() is None
    assert all(
        "get_peft_config" not in (ROOT / command).read_text() for command in ("train.py", "warm_start/warm_up.py")
    )


def test_lora_trains_without_dropout_unless_asked_so_a_reply_is_scored_as_it_was_sampled():
    # configs/smollm2_page_reading_cpu.yaml names no LoRA option: --use_peft alone must not bring TRL's 0.05.
    *_, model_args = parse_config("configs/smollm2_page_reading_cpu.yaml", "--use_peft")
    assert model_args.peft_config().lora_dropout == 0.0
    *_, model_args = parse_config("configs/smollm2_page_reading_cpu.yaml", "--use_peft", "--lora_dropout", "0.1")
    assert model_args.peft_config().lora_dropout == 0.1


def test_the_dataset_has_one_row_per_seed_with_a_unique_prompt():
    dataset = seed_dataset(5)
    assert dataset["seed"] == [0, 1, 2, 3, 4]
    assert len(set(dataset["prompt"])) == 5


@pytest.mark.parametrize(
    "yaml_text, overrides, message",
    [
        ("max_turn: 3\n", [], "unknown key 'max_turn' (did you mean 'max_turns'?)"),
        ("learning_rate: fast\n", [], "argument --learning_rate/--learning-rate: invalid float value: 'fast'"),
        ("max_turns: 0\n", [], "max_turns must be positive, got 0"),
        ("settle_ms: 5000\n", [], "settle_ms must be from 0 to 2000, got 5000"),
        ("task_name: click-tset\n", [], "task_name: unknown task 'click-tset'"),
        ("tasks: [click-button, enter-txt:2]\n", [], "tasks: 'enter-txt' is neither a task (MiniWoB's"),
        ("num_generations: 3\n", [], "generation_batch_size (16) must be divisible by num_generations (3)"),
        ("max_turns: [3\n", [], "not valid YAML: while parsing a flow sequence"),
        ("", ["--max_steps", "many"], "argument --max_steps/--max-steps: invalid int value: 'many'"),
        ("env_url: 8811\n", [], "env_url: expected a URL, URLs separated by commas, or a list of URLs, got 8811"),
        ("env_url: [127.0.0.1:8811]\n", [], "env_url: '127.0.0.1:8811' is not an http:// or https:// URL"),
    ],
)
def test_a_config_error_is_one_paragraph_naming_the_key_and_the_file(tmp_path, yaml_text, overrides, message):
    config = tmp_path / "recipe.yaml"
    config.write_text((ROOT / "configs/smoke.yaml").read_text() + yaml_text)
    with pytest.raises(ConfigError) as error:
        parse_args(["--config", str(config), *overrides])
    assert message in str(error.value)
    assert f"(in {config} or the command line)" in str(error.value)
    assert "\n" not in str(error.value)


URLS = ["http://127.0.0.1:8811", "http://127.0.0.1:8812"]


@pytest.mark.parametrize(
    "yaml_text, overrides",
    [
        ("env_url: [http://127.0.0.1:8811, http://127.0.0.1:8812]\n", []),
        ("env_url:\n  - http://127.0.0.1:8811\n  - http://127.0.0.1:8812\n", []),
        ("env_url: http://127.0.0.1:8811, http://127.0.0.1:8812\n", []),
        ("", ["--env_url", "http://127.0.0.1:8811,http://127.0.0.1:8812"]),
        ("", ["--env_url", "http://127.0.0.1:8811", "http://127.0.0.1:8812"]),
    ],
    ids=["YAML list", "YAML block list", "YAML string", "comma-separated argument", "two arguments"],
)
def test_env_url_takes_a_list_or_urls_separated_by_commas(tmp_path, yaml_text, overrides):
    config = tmp_path / "recipe.yaml"
    config.write_text((ROOT / "configs/smoke.yaml").read_text().replace("env_url: null\n", "") + yaml_text)
    _, _, servers, *_ = parse_args(["--config", str(config), *overrides])
    assert servers.env_url == URLS


def test_a_missing_config_file_is_named():
    with pytest.raises(ConfigError, match=r"config file not found: no/such\.yaml"):
        parse_args(["--config", "no/such.yaml"])


def test_train_py_exits_with_status_2_and_no_traceback_on_a_config_error(tmp_path):
    config = tmp_path / "recipe.yaml"
    config.write_text("model_name_or_path: x\nnot_an_option: 1\n")
    result = subprocess.run(
        [sys.executable, "train.py", "--config", str(config)], cwd=ROOT, capture_output=True, text=True
    )
    assert result.returncode == 2
    assert "train.py: configuration error: unknown key 'not_an_option'" in result.stderr
    assert str(config) in result.stderr and "Traceback" not in result.stderr


def test_the_learning_benchmark_config_plays_one_action_per_episode_on_the_cpu():
    _, episodes, *_, training_args, model_args = parse_config("configs/learning_click_test.yaml")
    assert episodes.max_turns == 1 and model_args.dtype == "float32" and training_args.use_vllm is False
    assert training_args.generation_batch_size % training_args.num_generations == 0


def test_the_page_reading_benchmark_config_gives_every_task_room_for_its_actions(tokenizer):
    tasks, episodes, *_, training_args, _ = parse_config("configs/learning_page_reading.yaml")
    assert list(tasks.task_weights()) == PRESETS["page-reading"] and tasks.curriculum is False
    assert episodes.max_turns >= 3  # login-user's three actions
    # A fill of a 12-letter name, or of a six-character password, and its end fit, in the tests' tokenizer and in
    # the benchmark's (MiniWoB's words whole, random letters apart).
    for words in (tokenizer, build_tokenizer(miniwob_vocabulary=True)):
        for fill in ("fill('16', 'Christabella')", "fill('119', 'Zq8wX2')"):
            reply = words.encode(fill, add_special_tokens=False) + [words.eos_token_id]
            assert len(reply) <= training_args.max_completion_length
    assert training_args.use_vllm is False


def test_an_unknown_command_line_argument_is_named():
    with pytest.raises(ConfigError, match="unrecognized arguments: --max_turnz 3"):
        parse_args(["--config", str(ROOT / "configs/smoke.yaml"), "--max_turnz", "3"])


def test_a_command_passes_over_the_keys_of_the_others_and_refuses_unknown_ones(tmp_path):
    config = tmp_path / "recipe.yaml"
    config.write_text((ROOT / "configs/smoke.yaml").read_text() + "modal_gpu: H100\ndemonstrations: d.jsonl\n")
    *_, model_args = parse_args(["--config", str(config)])  # modal_app.py's and the warm-up's keys
    assert model_args.model_name_or_path == ".cache/smoke-start"
    config.write_text((ROOT / "configs/smoke.yaml").read_text() + "modal_gpuu: H100\n")
    with pytest.raises(ConfigError, match=r"unknown key 'modal_gpuu' \(did you mean 'modal_gpu'\?\)"):
        parse_args(["--config", str(config)])


def test_one_step_of_the_recipes_full_fine_tune_changes_nearly_every_weight(tiny_model):
    # The trainer holds the weights in the dtype the recipe loads them in. In bf16, one AdamW step at 5e-6 changes
    # about one entry in twelve of a matrix of N(0, 0.02) weights; the other updates round away.
    *_, training_args, model_args = parse_config("config.yaml", "--model_name_or_path", tiny_model)
    weight = (
        AutoModelForCausalLM.from_pretrained(tiny_model, dtype=model_args.dtype).model.layers[0].feed_forward.w1.weight
    )
    with torch.no_grad():
        weight.normal_(0, 0.02)
    before = weight.detach().clone()
    weight.grad = torch.randn_like(weight)
    torch.optim.AdamW([weight], lr=training_args.learning_rate, weight_decay=training_args.weight_decay).step()
    assert (weight.detach() != before).float().mean() > 0.99


def test_a_model_path_that_does_not_exist_is_named_with_how_to_make_it(tmp_path):
    args = parse_config("configs/smoke.yaml", "--output_dir", str(tmp_path), "--model_name_or_path", ".cache/no-model")
    with pytest.raises(
        ConfigError, match=r"^model_name_or_path: model '.cache/no-model' does not exist\. `make setup`"
    ):
        train.main(*args)  # before any server starts or any model loads
    assert "`make smoke` the smoke run's start (.cache/smoke-start)" in missing_model(".cache/smoke-start-not-built")
    assert missing_model("LiquidAI/LFM2-350M") is None  # a hub id: loading finds out
    assert missing_model(str(tmp_path)) is None


def test_every_command_resolves_a_model_name_by_one_function_for_each_kind_of_name(tiny_model, tmp_path, monkeypatch):
    checkpoint, adapter = tmp_path / "run" / "checkpoint-5", tmp_path / "adapter"
    checkpoint.mkdir(parents=True)
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text("{}")
    for name in (tiny_model, str(checkpoint), str(adapter), "LiquidAI/LFM2-350M"):  # loaded as named
        assert resolve_model(name, "--model") == name
    with pytest.raises(ConfigError, match=r"^--model: model './no-model' does not exist"):
        resolve_model("./no-model", "--model")
    # A .gguf file: the checkpoint converted from it, found by its content (browser_rl.gguf).
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    policy = tmp_path / "policy.gguf"
    policy.write_bytes(b"a GGUF file's bytes")
    converted = (
        tmp_path / "cache" / "browser-rl" / "gguf" / f"policy-{hashlib.sha256(policy.read_bytes()).hexdigest()[:16]}"
    )
    converted.mkdir(parents=True)
    (converted / "config.json").write_text("{}")
    assert resolve_model(str(policy), "model_name_or_path") == str(converted)
    with pytest.raises(ConfigError, match=r"^model_name_or_path: model '.*other\.gguf' does not exist"):
        resolve_model(str(tmp_path / "other.gguf"), "model_name_or_path")
    resolving = ["train.py", "warm_start/record.py", "warm_start/warm_up.py", "export_gguf.py", "browser_rl/agent.py"]
    playing = ["browser_rl/evaluation.py", "run_agent.py"]  # through the agent (browser_rl/agent.py)
    for command in resolving + playing:  # and none resolves a name its own way
        source = (ROOT / command).read_text()
        assert ("resolve_model(" if command in resolving else "load_agent(") in source
        assert "as_checkpoint(" not in source and "missing_model(" not in source
    for command in playing:  # the agent loads the model too
        assert "load_policy(" not in (ROOT / command).read_text()


def test_a_checkpoint_to_resume_from_that_does_not_exist_says_the_option_is_not_needed(tiny_model, tmp_path):
    args = parse_config(
        "configs/smoke.yaml",
        *("--output_dir", str(tmp_path), "--model_name_or_path", tiny_model),
        *("--resume_from_checkpoint", "true"),
    )
    with pytest.raises(
        ConfigError,
        match=r"^resume_from_checkpoint: no checkpoint directory at 'true'; without the option a run resumes from the "
        r"last checkpoint in its output_dir$",
    ):
        train.main(*args)  # before any server starts


def test_the_train_split_config_trains_on_browsergym_s_62_train_tasks_with_the_curriculum():
    tasks, *_, training_args, _ = parse_config("configs/browsergym_train_cpu.yaml")
    assert sorted(tasks.task_weights()) == sorted(preset_tasks("browsergym-train")) and len(tasks.tasks) == 1
    assert len(tasks.task_weights()) == 62 and tasks.curriculum is True
    assert training_args.use_vllm is False and training_args.generation_batch_size % training_args.num_generations == 0


def test_the_page_reading_steps_start_from_the_warm_up_kept_at_its_lowest_validation_loss():
    """Warm-up, then GRPO (README.md's real-model commands), and filtered behaviour cloning beside GRPO: GRPO and
    cloning start from the warm-up's output, which keeps the model of its lowest validation loss, and cloning samples
    its episodes as GRPO does (docs/rl_gain.md measured that pipeline)."""
    warm_up_config = ["--config", str(ROOT / "configs/warm_up/smollm2_page_reading_cpu.yaml")]
    cloning_config = ["--config", str(ROOT / "configs/warm_up/smollm2_page_reading_bc_cpu.yaml")]
    warm_up_args, _, warmed, _ = parse_command_line(warm_up.OPTIONS, warm_up_config)
    sampling, tasks, _, _, tokenizer_of = parse_command_line(record.OPTIONS, cloning_config)
    learning, _, cloned, cloned_from = parse_command_line(warm_up.OPTIONS, cloning_config)
    grpo_tasks, *_, grpo, grpo_from = parse_config("configs/smollm2_page_reading_cpu.yaml")
    assert warm_up_args.validation_share > 0 and warmed.load_best_model_at_end and warmed.num_train_epochs > 1
    assert grpo_from.model_name_or_path == warmed.output_dir
    assert sampling.sampled_by == tokenizer_of.model_name_or_path == cloned_from.model_name_or_path
    assert sampling.sampled_by == warmed.output_dir
    assert sampling.demonstrations == learning.demonstrations and not learning.keep_failed
    assert sampling.temperature == grpo.temperature and tasks.task_weights() == grpo_tasks.task_weights()
    assert sampling.first_seed + sampling.episodes <= grpo_tasks.num_task_seeds  # training seeds, never held-out ones
    assert cloned.output_dir not in (warmed.output_dir, grpo.output_dir)


@pytest.mark.parametrize("command", [train, evaluate_py, record, warm_up], ids=lambda module: module.__name__)
def test_every_option_s_help_is_shown(command, capsys):
    """argparse formats each help text with %: a stray one (say, "50%") breaks --help, and the slow tier's run of
    every command's --help is the only other place that would notice."""
    with pytest.raises(SystemExit) as exited:
        parse_command_line(command.OPTIONS, ["--help"])
    assert exited.value.code == 0 and "--max_turns" in capsys.readouterr().out


def test_configs_index_lists_every_config_each_named_on_the_one_rule():
    index = (ROOT / "configs" / "README.md").read_text()
    listed = re.findall(r"^\| `([a-z_/0-9]+\.yaml)` \|", index, re.M)
    files = sorted(str(path.relative_to(ROOT / "configs")) for path in (ROOT / "configs").rglob("*.yaml"))
    assert sorted(listed) == files
    rule = re.compile(r"(accelerate/[a-z0-9]+|(warm_up/)?(smoke|smollm2_[a-z_]+_cpu|learning_[a-z_]+|[a-z_]+))\.yaml")
    assert [name for name in files if not rule.fullmatch(name)] == []
    for name in files:  # a warm-up is step 1 of a run of the same name, comes before a run it names, or stands alone
        if name.startswith("warm_up/") and not (ROOT / "configs" / name.removeprefix("warm_up/")).exists():
            line = index.split(f"`{name}`")[1].splitlines()[0]
            before = re.findall(r"before `([a-z_0-9]+\.yaml)`", line)
            assert "a warm-up only" in line or (before and (ROOT / "configs" / before[0]).exists()), name
