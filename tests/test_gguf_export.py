"""export_gguf.py: a trained policy written as one GGUF file, read back through the recipe's own `.gguf` policy path
with the same weights, tokenizer and episode settings, and playing the same greedy episodes; the real model's file
laid out as llama.cpp's own converter lays out the same model (slow tier)."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import gguf
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

import evaluate
import export_gguf
from browser_rl.command_line import run_command
from browser_rl.episode_settings import SETTINGS_FILE, EpisodeSettings
from browser_rl.gguf import read_gguf, settings_in
from browser_rl.prompts import ChatTurns
from conftest import made_once
from web_env.models import BrowserGymObservation


def export(monkeypatch, model, output, *options):
    """`python export_gguf.py --model MODEL --output OUTPUT ...`, as the command line runs it."""
    monkeypatch.setattr(sys, "argv", ["export_gguf.py", "--model", str(model), "--output", str(output), *options])
    run_command("export_gguf.py", export_gguf.main)


def tiny_llama(tokenizer_dir, folder):
    """A two-layer Llama with grouped-query attention (3 query heads to 1 key-value head, as SmolLM2 has them)."""
    config = LlamaConfig(
        vocab_size=466, hidden_size=96, intermediate_size=128, num_hidden_layers=2, num_attention_heads=3,
        num_key_value_heads=1, head_dim=32, tie_word_embeddings=True, bos_token_id=1, eos_token_id=7, pad_token_id=0,
    )  # fmt: skip
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(folder)
    AutoTokenizer.from_pretrained(tokenizer_dir).save_pretrained(folder)
    return folder


@pytest.mark.parametrize("architecture", ["lfm2", "llama"])
def test_a_model_exported_exactly_reads_back_with_the_same_weights_tokenizer_and_settings(
    architecture, tiny_model, tmp_path, monkeypatch
):
    if architecture == "lfm2":
        model = shutil.copytree(tiny_model, tmp_path / "lfm2")
    else:
        model = tiny_llama(tiny_model, tmp_path / "llama")
    EpisodeSettings(max_turns=3, max_page_chars=1500).save(model)
    export(monkeypatch, model, tmp_path / "agent.gguf", "--outtype", "f32")

    back, tokenizer = read_gguf(tmp_path / "agent.gguf")
    source = type(back).from_pretrained(model)
    assert back.config.model_type == architecture
    weights = source.state_dict()
    assert weights.keys() == back.state_dict().keys()
    for name, tensor in back.state_dict().items():
        assert torch.equal(tensor, weights[name]), name  # a tensor misnamed, or its rows in another order
    original = AutoTokenizer.from_pretrained(model)
    text = "<|im_start|>user\nclick('12') on the Submit button<|im_end|>"
    assert tokenizer(text).input_ids == original(text).input_ids
    assert tokenizer.chat_template == original.chat_template
    assert (tokenizer.eos_token_id, tokenizer.pad_token_id) == (original.eos_token_id, original.pad_token_id)
    assert settings_in(tmp_path / "agent.gguf") == EpisodeSettings(max_turns=3, max_page_chars=1500)


def test_an_exported_policy_plays_the_same_greedy_episodes_through_the_gguf_policy_path(
    half_right_model, env_server, tmp_path, gguf_cache, monkeypatch, capsys
):
    agent = tmp_path / "agent.gguf"
    export(monkeypatch, half_right_model, agent, "--outtype", "f32")

    def played(model: str) -> list[dict]:
        output_dir = tmp_path / f"eval-{len(list(tmp_path.glob('eval-*')))}"
        arguments = ["--model", model, "--tasks", "click-test", "--episodes", "8", "--output_dir", str(output_dir)]
        monkeypatch.setattr(sys, "argv", ["evaluate.py", *arguments, "--env_url", env_server.url])
        run_command("evaluate.py", evaluate.main)
        return [json.loads(line) for line in (output_dir / "episodes.jsonl").read_text().splitlines()]

    before = played(half_right_model)
    after = played(str(agent))
    assert [(e["seed"], e["replies"], e["success"]) for e in after] == [
        (e["seed"], e["replies"], e["success"]) for e in before
    ]
    assert any(e["success"] for e in before)  # a policy that plays, not one that never acts
    (converted,) = gguf_cache.iterdir()
    saved = json.loads((converted / SETTINGS_FILE).read_text())
    assert saved == json.loads(Path(half_right_model, SETTINGS_FILE).read_text())
    modelfile = (tmp_path / "agent.Modelfile").read_text()
    assert modelfile.startswith('# ollama create NAME -f agent.Modelfile\nFROM ./agent.gguf\nSYSTEM """You control')


def test_an_eight_bit_export_is_a_quarter_the_size_and_close(tiny_model, tmp_path, monkeypatch):
    llama = tiny_llama(tiny_model, tmp_path / "llama")
    export(monkeypatch, llama, tmp_path / "f32.gguf", "--outtype", "f32")
    export(monkeypatch, llama, tmp_path / "q8.gguf", "--outtype", "q8_0")
    reader = gguf.GGUFReader(tmp_path / "q8.gguf")
    assert {t.tensor_type.name for t in reader.tensors if len(t.shape) == 2} == {"Q8_0"}
    assert (tmp_path / "q8.gguf").stat().st_size < 0.4 * (tmp_path / "f32.gguf").stat().st_size
    exact, _ = read_gguf(tmp_path / "f32.gguf")
    rounded, _ = read_gguf(tmp_path / "q8.gguf")
    for name, tensor in rounded.state_dict().items():
        reference = exact.state_dict()[name]
        assert (tensor - reference).abs().max() <= reference.abs().max() / 100, name  # 8 bits of each block's scale


def test_a_model_without_saved_settings_is_exported_with_the_defaults_named(tiny_model, tmp_path, monkeypatch, caplog):
    export(monkeypatch, tiny_model, tmp_path / "agent.gguf")
    assert f"{tiny_model} has no saved episode settings: the file carries the defaults (max_turns 10," in caplog.text
    fields = gguf.GGUFReader(tmp_path / "agent.gguf").fields
    assert fields["browser_rl.max_turns"].contents() == 10


def test_an_architecture_the_exporter_does_not_cover_is_refused_in_one_line(tiny_model, tmp_path, monkeypatch, capsys):
    GPT2LMHeadModel(GPT2Config(vocab_size=466, n_embd=32, n_layer=1, n_head=2)).save_pretrained(tmp_path / "gpt2")
    AutoTokenizer.from_pretrained(tiny_model).save_pretrained(tmp_path / "gpt2")
    with pytest.raises(SystemExit) as exit:
        export(monkeypatch, tmp_path / "gpt2", tmp_path / "agent.gguf")
    assert exit.value.code == 2 and not (tmp_path / "agent.gguf").exists()
    refused = "export_gguf.py: the GGUF export writes llama and lfm2 models; this one is 'gpt2'"
    assert capsys.readouterr().err.splitlines()[-1] == refused  # after transformers' bar of the weights it read


@pytest.fixture(scope="module")
def real_model_exported(real_model, tmp_path_factory):
    """The real model exported in full precision, once for the two tests that read it (slow tier)."""
    output = tmp_path_factory.mktemp("real-gguf") / "smollm2.gguf"
    with pytest.MonkeyPatch.context() as monkeypatch:
        export(monkeypatch, real_model, output, "--outtype", "f32")
    return output


@pytest.mark.slow
def test_the_real_model_s_file_is_laid_out_as_llama_cpp_lays_out_the_same_model(real_model_exported, real_gguf):
    ours, theirs = gguf.GGUFReader(real_model_exported), gguf.GGUFReader(real_gguf)
    assert {t.name: list(t.shape) for t in ours.tensors} == {t.name: list(t.shape) for t in theirs.tensors}
    keys = {"general.architecture", "tokenizer.ggml.model", "tokenizer.ggml.tokens", "tokenizer.ggml.token_type"}
    keys |= {k for k in theirs.fields if k.startswith("llama.")} | {"tokenizer.ggml.merges", "tokenizer.chat_template"}
    for key in sorted(keys):
        assert ours.fields[key].contents() == theirs.fields[key].contents(), key


def node_llama_cpp(folder: Path) -> None:
    """llama.cpp's prebuilt CPU build, as npm's node-llama-cpp ships it (85 MB; no compiler needed)."""
    packages = ["node-llama-cpp@3.22.1", "@node-llama-cpp/linux-x64@3.22.1"]
    install = ["npm", "install", "--no-audit", "--no-fund", "--omit=optional", "--ignore-scripts", *packages]
    subprocess.run(install, cwd=folder, check=True, capture_output=True, timeout=600)


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("npm") is None, reason="no npm here: llama.cpp's prebuilt build comes from npm")
def test_llama_cpp_reads_the_exported_real_model_and_replies_as_transformers_does(
    real_model, real_model_exported, tmp_path_factory, worker_id, tmp_path
):
    llama_cpp = made_once(tmp_path_factory, worker_id, "llama-cpp", node_llama_cpp)
    model, tokenizer = AutoModelForCausalLM.from_pretrained(real_model), AutoTokenizer.from_pretrained(real_model)
    turns = ChatTurns(tokenizer, max_page_chars=2000)
    contexts = []
    for goal, page in PAGES:
        ids = turns.first_prompt(BrowserGymObservation(goal=goal, axtree_txt=page))
        with torch.no_grad():
            reply = model.generate(torch.tensor([ids]), max_new_tokens=12, do_sample=False)[0, len(ids) :].tolist()
        contexts.append({"text": tokenizer.decode(ids), "ids": ids, "max_tokens": 12, "reply": reply})
    (tmp_path / "contexts.json").write_text(json.dumps(contexts))
    script = shutil.copy(Path(__file__).with_name("llama_cpp_replies.mjs"), llama_cpp)
    run = subprocess.run(
        ["node", script, str(real_model_exported), str(tmp_path / "contexts.json")],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    assert "pre-tokenizer" not in run.stderr  # llama.cpp knows how the text is split
    answers = json.loads(run.stdout.splitlines()[-1])
    assert [a["tokenized"] for a in answers] == [c["ids"] for c in contexts]  # the prompt, special tokens and all
    assert [a["reply"] for a in answers] == [c["reply"] for c in contexts]


# Pages as the recipe shows them (BrowserGym's accessibility tree) and their goals, for the replies above.
PAGES = [
    ('Click on the "Submit" button.', "RootWebArea 'Click Test', focused\n\t[13] button 'Submit'\n\t[14] button 'No'"),
    ("Select Bob from the list and click Submit.", "RootWebArea '', focused\n\t[15] combobox '' value='Alice'\n\t\t"
     "[16] option 'Alice', selected=True\n\t\t[17] option 'Bob', selected=False\n\t[18] button 'Submit'"),
    ('Enter "kiwi" into the text field and press Submit.', "RootWebArea '', focused\n\t[12] textbox ''\n\t"
     "[13] button 'Submit'"),
]  # fmt: skip
