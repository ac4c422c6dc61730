import logging

import pytest
import yaml
import torch
from peft import get_peft_model
from transformers import AutoModelForCausalLM
from trl import get_peft_config

from helpers import ROOT, parse_config
from train import task_dataset

LFM2_LINEAR_LAYERS = {"q_proj", "k_proj", "v_proj", "out_proj", "in_proj", "w1", "w2", "w3"}


def test_the_recipe_config_loads_with_its_real_settings():
    env_args, training_args, model_args = parse_config("config.yaml")
    assert model_args.model_name_or_path == "LiquidAI/LFM2-350M"
    assert env_args.task_name == "click-test" and env_args.env_url is None and env_args.max_turns == 10
    assert training_args.num_generations == 4 and training_args.vllm_mode == "colocate"
    assert set(model_args.lora_target_modules) == LFM2_LINEAR_LAYERS
    assert not model_args.use_peft  # full fine-tune unless --use_peft


def test_the_recipe_asks_for_colocated_vllm_on_the_gpu():
    recipe = yaml.safe_load((ROOT / "config.yaml").read_text())
    assert recipe["use_vllm"] is True and recipe["vllm_mode"] == "colocate" and recipe["bf16"] is True


def test_without_cuda_the_config_falls_back_to_transformers_and_says_so(caplog):
    with caplog.at_level(logging.WARNING, logger="train"):
        _, training_args, _ = parse_config("config.yaml")
    assert training_args.use_vllm is False and training_args.bf16 is False
    assert "No CUDA device: generating with transformers instead of vLLM" in caplog.text


def test_command_line_overrides_the_file():
    env_args, training_args, model_args = parse_config(
        "config.yaml", "--task_name", "enter-text", "--max_steps", "7", "--use_peft", "--learning_rate", "1e-4"
    )
    assert (env_args.task_name, training_args.max_steps, model_args.use_peft) == ("enter-text", 7, True)
    assert training_args.learning_rate == 1e-4


def test_smoke_config_loads():
    env_args, training_args, model_args = parse_config("configs/smoke.yaml")
    assert model_args.model_name_or_path == ".cache/tiny-lfm2"
    assert training_args.generation_batch_size % training_args.num_generations == 0


def test_lora_targets_every_linear_layer_of_lfm2(tiny_model):
    _, _, model_args = parse_config("config.yaml", "--use_peft")
    linear_layers = [
        name
        for name, module in AutoModelForCausalLM.from_pretrained(tiny_model).named_modules()
        if isinstance(module, torch.nn.Linear) and name != "lm_head"
    ]
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_model), get_peft_config(model_args))
    adapted = [name for name, module in model.named_modules() if hasattr(module, "lora_A")]
    assert {name.split(".")[-1] for name in adapted} == LFM2_LINEAR_LAYERS
    assert len(adapted) == len(linear_layers)  # every linear layer of every block, attention and convolution


def test_task_dataset_has_one_row_per_seed_with_a_unique_prompt():
    dataset = task_dataset("click-test", 5)
    assert dataset["seed"] == [0, 1, 2, 3, 4]
    assert len(set(dataset["prompt"])) == 5 and set(dataset["task_name"]) == {"click-test"}


def test_an_unknown_config_key_is_refused(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("model_name_or_path: x\nnot_an_option: 1\n")
    with pytest.raises(ValueError, match="not_an_option"):
        parse_config(str(bad))
