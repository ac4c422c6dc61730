"""The private seams of the project's dependencies that it relies on, as pyproject.toml lists them: each checked here
by name, so that an upgrade that moves one fails with the seam's name before it fails anywhere else."""

import inspect
import re
import tomllib

import pytest

from helpers import ROOT

SEAMS = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["browser-rl"]["private-seams"]


def grpo_metric_buffer():
    from trl import GRPOTrainer

    assert 'self._metrics = {"train": defaultdict(list)' in inspect.getsource(GRPOTrainer.__init__)
    log = inspect.getsource(GRPOTrainer.log)
    assert "self._metrics[mode].items()" in log and "self._metrics[mode].clear()" in log


def rng_state_saved_before_the_trainer_state():
    from transformers import Trainer

    saving = inspect.getsource(Trainer._save_checkpoint)
    assert 0 <= saving.index("self._save_rng_state(output_dir)") < saving.index("self.state.save_to_json(")
    assert list(inspect.signature(Trainer._save_rng_state).parameters) == ["self", "output_dir"]


def rng_state_loaded_on_resume():
    from transformers import Trainer

    assert "self._load_rng_state(resume_from_checkpoint)" in inspect.getsource(Trainer._run_epoch)
    assert list(inspect.signature(Trainer._load_rng_state).parameters) == ["self", "checkpoint"]


def marking():
    from browsergym.core.observation import _pre_extract

    assert list(inspect.signature(_pre_extract).parameters) == ["page", "tags_to_mark", "lenient"]


def unmarking():
    from browsergym.core.observation import _post_extract

    assert list(inspect.signature(_post_extract).parameters) == ["page"]


def a_devtools_session_per_extraction():
    from browsergym.core import observation

    extractions = (observation.extract_dom_snapshot, observation.extract_merged_axtree, observation.extract_screenshot)
    for extract in extractions:
        source = inspect.getsource(extract)
        assert "page.context.new_cdp_session(page)" in source and ".detach()" in source, extract.__name__


def playwright_call_stacks(module_name: str):
    def check():
        import importlib

        module = importlib.import_module(f"playwright._impl.{module_name}")
        assert module.inspect.__name__ == "inspect" or hasattr(module.inspect, "stack")
        assert "inspect.stack(" in inspect.getsource(module)

    return check


def vllm_cpu_linear_dispatch():
    utils = pytest.importorskip("vllm.model_executor.layers.utils")
    assert list(inspect.signature(utils.dispatch_cpu_unquantized_gemm).parameters)[:2] == ["layer", "remove_weight"]


def modal_sdk_adapter():
    from openenv.core.containers.runtime import modal_provider

    assert "self._adapter: Any = _DefaultModalAdapter(" in inspect.getsource(modal_provider.ModalProvider.__init__)


def optional_web_interface():
    from openenv.core import env_server

    source = inspect.getsource(env_server)
    importing = "try:\n    from .web_interface import create_web_interface_app, WebInterfaceManager\n"
    assert importing + "except ModuleNotFoundError:" in source


def fused_lm_head_compaction():
    from trl.trainer import utils

    source = inspect.getsource(utils.add_fused_lm_head)
    assert "compact = _use_triton(hidden_states.device)" in source and "hidden_states[mask] if compact" in source
    assert list(inspect.signature(utils._use_triton).parameters) == ["device"]


def losses_scaled_by_the_advantage():
    """The loss types browser_rl.trainer knows to scale each episode's terms by its advantage (read in TRL's source
    when this list was written): one more upstream fails here until it is read too."""
    from trl import GRPOTrainer

    source = inspect.getsource(GRPOTrainer._compute_loss)
    assert 'advantages = inputs["advantages"]' in source
    named = re.findall(r'self\.loss_type (?:==|in) (\[[^\]]*\]|"[^"]*")', source)
    assert {name for names in named for name in re.findall(r'"([a-z_]+)"', names)} == {
        *("grpo", "bnpo", "dr_grpo", "dapo", "luspo", "cispo", "sapo", "vespo")
    }


def trainer_method(name: str):
    def check():
        from trl import GRPOTrainer

        assert callable(getattr(GRPOTrainer, name, None))

    return check


def modal_function_spec():
    import modal_app

    assert modal_app.train_remote._spec_.gpus == modal_app.DEFAULT_OPTIONS["gpu"]


CHECKS = {
    "trl.GRPOTrainer._metrics": grpo_metric_buffer,
    "transformers.Trainer._save_rng_state": rng_state_saved_before_the_trainer_state,
    "transformers.Trainer._load_rng_state": rng_state_loaded_on_resume,
    "browsergym.core.observation._pre_extract": marking,
    "browsergym.core.observation._post_extract": unmarking,
    "browsergym.core.observation.extract_*": a_devtools_session_per_extraction,
    "playwright._impl._sync_base.inspect": playwright_call_stacks("_sync_base"),
    "playwright._impl._connection.inspect": playwright_call_stacks("_connection"),
    "trl.trainer.utils._use_triton": fused_lm_head_compaction,
    "vllm.model_executor.layers.utils.dispatch_cpu_unquantized_gemm": vllm_cpu_linear_dispatch,
    "openenv.core.containers.runtime.modal_provider._DefaultModalAdapter": modal_sdk_adapter,
    "trl.GRPOTrainer._compute_loss": losses_scaled_by_the_advantage,
    "trl.GRPOTrainer._generate_and_score_completions": trainer_method("_generate_and_score_completions"),
    "trl.GRPOTrainer._get_per_token_logps_and_entropies": trainer_method("_get_per_token_logps_and_entropies"),
    "openenv.core.env_server.web_interface": optional_web_interface,
    "modal.Function._spec_": modal_function_spec,
}


def test_every_listed_seam_is_checked_and_every_check_is_listed():
    assert sorted(SEAMS) == sorted(CHECKS)


@pytest.mark.parametrize("seam", sorted(SEAMS))
def test_the_seam_is_where_the_project_relies_on_it(seam):
    CHECKS[seam]()
