"""What the policy sees has one source: the episode settings travel with the model, checkpoint or demonstrations they
shaped, a command that starts from one takes them from it, and one told otherwise refuses unless told it is on
purpose, which it then reports."""

import json
import shutil

import pytest

import train
from browser_rl import episode_settings
from browser_rl.command_options import EvalArguments, WarmUpArguments
from browser_rl.episode_settings import DEFAULTS, SETTINGS_FILE, EpisodeSettings, resolve, saved_with
from browser_rl.errors import ConfigError, DemonstrationsError
from browser_rl.evaluation import evaluate
from browser_rl.evaluation_report import report
from browser_rl.options import EpisodeArguments, ModelOptions, ServerArguments, TaskArguments
from browser_rl.prompts import PROMPT_VERSION
from helpers import parse_config
from warm_start import warm_up
from warm_start.demonstrations import load, made_with
from warm_start.weak_starts import weak_start_config


def test_a_setting_left_unset_comes_from_what_it_was_made_with_and_one_set_alike_is_accepted():
    made = EpisodeSettings(max_turns=12, max_page_chars=3000, settle_ms=300)
    assert resolve(EpisodeArguments(), made, "m").settings == made
    assert resolve(EpisodeArguments(max_page_chars=3000), made, "m").settings == made
    assert resolve(EpisodeArguments(), None, "m").settings == DEFAULTS  # a base model says nothing: the defaults
    assert resolve(EpisodeArguments(max_turns=5), None, "m").settings.max_turns == 5


def test_a_setting_given_otherwise_is_refused_in_one_line_naming_both_unless_overridden_on_purpose():
    made = EpisodeSettings(max_turns=12, max_page_chars=3000)
    with pytest.raises(ConfigError) as refused:
        resolve(EpisodeArguments(max_page_chars=2000), made, "outputs/book-flight")
    message = str(refused.value)
    assert "outputs/book-flight was made with max_turns 12, max_page_chars 3000" in message
    assert "max_page_chars 2000, not the 3000 it was made with" in message and "\n" not in message
    overridden = resolve(EpisodeArguments(max_page_chars=2000, override_episode_settings=True), made, "m")
    assert overridden.settings.max_page_chars == 2000
    assert overridden.overridden == ("max_page_chars 2000, not the 3000 it was made with",)


def test_a_model_made_with_another_prompt_is_refused():
    earlier = PROMPT_VERSION - 1
    with pytest.raises(ConfigError, match=f"prompt_version {PROMPT_VERSION}, not the {earlier} it was made with"):
        resolve(EpisodeArguments(), EpisodeSettings(prompt_version=earlier), "m")


def demonstrations_file(path, settings: list[dict | None]):
    rows = []
    for seed, said in enumerate(settings):
        row = {
            "version": 1,
            "task": "click-test",
            "seed": 2_000_000 + seed,
            "goal": "Click the button.",
            "turns": [{"page": "[13] button 'Click Me!'", "reply": "click('13')", "error": ""}],
            "done": True,
            "reward": 1.0,
        }
        rows.append(row | ({"settings": said} if said is not None else {}))
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


AT_3000 = {"max_turns": 10, "max_page_chars": 3000, "settle_ms": 0, "prompt_version": PROMPT_VERSION}


def test_demonstrations_say_what_they_were_played_with_all_of_it_and_all_alike(tmp_path):
    path = demonstrations_file(tmp_path / "demos.jsonl", [AT_3000, AT_3000])
    assert made_with(load(path), path) == EpisodeSettings(max_page_chars=3000)
    unsaid = demonstrations_file(tmp_path / "unsaid.jsonl", [None])
    assert made_with(load(unsaid), unsaid) is None  # a file written by hand may leave them out
    mixed = demonstrations_file(tmp_path / "mixed.jsonl", [AT_3000, AT_3000 | {"max_page_chars": 2000}])
    with pytest.raises(DemonstrationsError, match="played with different episode settings"):
        made_with(load(mixed), mixed)
    partial = demonstrations_file(tmp_path / "partial.jsonl", [{"max_page_chars": 3000}])
    with pytest.raises(
        DemonstrationsError, match="settings: Value error, missing max_turns, settle_ms, prompt_version"
    ):
        load(partial)


def test_demonstrations_recorded_at_one_page_limit_refuse_to_warm_up_at_another(tiny_model, tmp_path):
    path = demonstrations_file(tmp_path / "demos.jsonl", [AT_3000])
    config, model = weak_start_config(tmp_path / "warm", 1, 1, 1e-3), ModelOptions(model_name_or_path=tiny_model)
    with pytest.raises(ConfigError, match="max_page_chars 2000, not the 3000 it was made with"):
        warm_up.main(WarmUpArguments(demonstrations=str(path)), EpisodeArguments(max_page_chars=2000), config, model)
    assert not (tmp_path / "warm").exists()  # refused before anything was trained or written
    warm_up.main(WarmUpArguments(demonstrations=str(path)), EpisodeArguments(), config, model)
    assert saved_with(str(tmp_path / "warm")) == EpisodeSettings(max_page_chars=3000)


@pytest.fixture
def trained_at_two_turns(tiny_model, tmp_path):
    """The tiny model as a run that played two-turn episodes of 3,000 characters a page would have saved it."""
    model = tmp_path / "model"
    shutil.copytree(tiny_model, model)
    EpisodeSettings(max_turns=2, max_page_chars=3000).save(model)
    return model


def test_evaluating_a_model_plays_it_as_it_was_trained_without_being_told(trained_at_two_turns, env_server, tmp_path):
    args = EvalArguments(model=str(trained_at_two_turns), episodes=3, batch_size=3, output_dir=str(tmp_path / "e"))
    servers = ServerArguments(env_url=[env_server.url])
    summary = evaluate(args, TaskArguments(), EpisodeArguments(), servers)
    assert summary["episode_settings"] == vars(EpisodeSettings(max_turns=2, max_page_chars=3000))
    # The random tiny model never solves click-test: every episode runs the model's two turns, not the default ten.
    records = [json.loads(line) for line in (tmp_path / "e" / "episodes.jsonl").read_text().splitlines()]
    assert [record["turns"] for record in records] == [2, 2, 2]
    assert "episodes played with max_turns 2, max_page_chars 3000" in report(summary)
    with pytest.raises(ConfigError, match="max_turns 1, not the 2 it was made with"):
        evaluate(args, TaskArguments(), EpisodeArguments(max_turns=1), servers)


def test_an_evaluation_told_otherwise_on_purpose_plays_so_and_says_so(trained_at_two_turns, env_server, tmp_path):
    args = EvalArguments(model=str(trained_at_two_turns), episodes=2, batch_size=2, output_dir=str(tmp_path / "e"))
    episodes = EpisodeArguments(max_turns=1, override_episode_settings=True)
    summary = evaluate(args, TaskArguments(), episodes, ServerArguments(env_url=[env_server.url]))
    assert summary["episode_settings"]["max_turns"] == 1
    assert "not as the model was trained, on purpose: max_turns 1, not the 2 it was made with" in report(summary)


def test_training_refuses_to_play_a_warm_start_otherwise_before_any_server_starts(trained_at_two_turns, tmp_path):
    args = parse_config(
        "configs/smoke.yaml",
        *("--model_name_or_path", str(trained_at_two_turns), "--output_dir", str(tmp_path / "run")),
        *("--env_url", "http://127.0.0.1:9"),  # nothing listens there: a server asked for would fail otherwise
    )
    with pytest.raises(ConfigError, match="max_turns 1, not the 2 it was made with"):
        train.main(*args)  # configs/smoke.yaml plays one turn


def test_a_resumed_run_refuses_a_checkpoint_made_with_other_settings(tmp_path, tiny_model):
    checkpoint = tmp_path / "run" / "checkpoint-3"
    checkpoint.mkdir(parents=True)
    (checkpoint / "trainer_state.json").write_text("{}")
    EpisodeSettings(max_turns=1, max_page_chars=1000).save(checkpoint)
    args = parse_config(
        "configs/smoke.yaml",
        *("--model_name_or_path", tiny_model, "--output_dir", str(tmp_path / "run"), "--env_url", "http://127.0.0.1:9"),
    )
    with pytest.raises(ConfigError, match=f"{checkpoint} was made with .*max_page_chars 2000, not the 1000"):
        train.main(*args)
    assert episode_settings.saved_with(str(checkpoint)).max_page_chars == 1000
    assert (checkpoint / SETTINGS_FILE).exists()


def test_a_hub_ids_saved_settings_are_read_from_the_hub_or_offline_from_its_cache(tmp_path, monkeypatch):
    import huggingface_hub.constants

    # The Hub cannot be reached here: a model pushed as `you/agent`, as the Hub's cache holds it after a download.
    snapshot = tmp_path / "hub" / "models--you--agent" / "snapshots" / ("a" * 40)
    snapshot.mkdir(parents=True)
    (tmp_path / "hub" / "models--you--agent" / "refs").mkdir()
    (tmp_path / "hub" / "models--you--agent" / "refs" / "main").write_text("a" * 40)
    EpisodeSettings(max_turns=3, max_page_chars=1500).save(snapshot)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    assert saved_with("you/agent") == EpisodeSettings(max_turns=3, max_page_chars=1500)
    assert saved_with("you/base-model") is None  # nothing saved, or nothing the cache holds: the defaults
