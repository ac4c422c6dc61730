"""Peak memory of one GRPO training micro-step of an LFM2-350M-shaped model, as TRL's loss computes it.

    python bench/memory.py --tokens 8192 --batch 2           # full fine-tune: fp32 weights, bf16 autocast
    python bench/memory.py --tokens 8192 --batch 2 --lora    # LoRA r=8 on every linear layer, bf16 base
    python bench/memory.py --tokens 2048 4096 --batch 1      # several lengths, each in a fresh process

The model has LFM2-350M's published architecture (16 layers, 6 of them attention, 1024 wide, a 65,536-token
vocabulary) with random weights. One micro-step is what TRL's GRPOTrainer does per micro-batch: forward with
TRL's own fused LM head (per-token log-probabilities computed in tiles, never the whole [tokens, vocabulary]
logits), under bf16 autocast, with gradient checkpointing (GRPOConfig's default), then backward and an AdamW
step. Every token but the first 1,000 (the first prompt) is scored, as in a long multi-turn episode.

The step is measured after one warm-up step, so that AdamW's state exists, as in every step of a run but the
first. Its peak is counted by tensor: the bytes of every live tensor storage, weights and optimizer state
included, at the worst moment of the step. That counts what the tensors take wherever they live, so the
figure on a CPU is the figure the same tensors take on a GPU; on a GPU the script also reports
torch.cuda.max_memory_allocated, which adds the allocator's rounding and cuBLAS workspaces.
"""

import argparse
import json
import subprocess
import sys
import time
import weakref
from pathlib import Path

import torch
from peft import LoraConfig, get_peft_model
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from transformers import Lfm2Config, Lfm2ForCausalLM
from trl.trainer.utils import add_fused_lm_head

# LFM2-350M's published architecture, as bench/gpu_step.py builds it too.
LFM2_350M = json.loads((Path(__file__).parent / "lfm2-350m.json").read_text())
PROMPT_TOKENS = 1000
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "out_proj", "in_proj", "w1", "w2", "w3"]


class PeakTensorMemory(TorchDispatchMode):
    """The bytes held by live tensor storages, and their peak: the tensors given, and every tensor an operation
    returns while the mode is active (each storage counted once, however many views share it)."""

    def __init__(self, tensors):
        super().__init__()
        self.live, self.current, self.peak = {}, 0, 0
        for tensor in tensors:
            self._track(tensor)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for value in tree_flatten(out)[0]:
            if isinstance(value, torch.Tensor):
                self._track(value)
        return out

    def _track(self, tensor: torch.Tensor) -> None:
        storage = tensor.untyped_storage()
        key = StorageWeakRef(storage)
        if key in self.live or storage.nbytes() == 0:
            return
        self.live[key] = storage.nbytes()
        self.current += storage.nbytes()
        self.peak = max(self.peak, self.current)
        weakref.finalize(storage, self._free, key)

    def _free(self, key) -> None:
        self.current -= self.live.pop(key)


def micro_step(tokens: int, batch: int, lora: bool, device: torch.device) -> dict:
    torch.manual_seed(0)
    model = Lfm2ForCausalLM(Lfm2Config(**LFM2_350M)).to(device, torch.bfloat16 if lora else torch.float32)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.config.use_cache = False
    add_fused_lm_head(model, outputs=("log_probs", "entropy"))  # what GRPOTrainer does, before PEFT
    if lora:
        model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules=LORA_TARGETS))
    parameters = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(parameters, lr=5e-6)
    input_ids = torch.randint(0, LFM2_350M["vocab_size"], (batch, tokens), device=device)
    labels = input_ids.clone()
    labels[:, :PROMPT_TOKENS] = -100

    def step() -> None:
        with torch.autocast(device.type, dtype=torch.bfloat16):
            out = model(input_ids=input_ids, labels=labels, fused_lm_head=True)
        (-out.log_probs.sum() / out.label_mask.sum()).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)  # as the trainer does after each optimizer step

    step()  # AdamW's state now exists, as in every step but a run's first
    state = [value for values in optimizer.state.values() for value in values.values() if torch.is_tensor(value)]
    static = sum(t.untyped_storage().nbytes() for t in [*model.parameters(), *model.buffers(), *state])
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    start = time.perf_counter()
    with PeakTensorMemory([*model.parameters(), *model.buffers(), *state]) as memory:
        step()
    result = {
        "tokens": tokens,
        "batch": batch,
        "method": "LoRA" if lora else "full",
        "device": device.type,
        "parameters_M": sum(p.numel() for p in model.parameters()) / 1e6,
        "trainable_M": sum(p.numel() for p in parameters) / 1e6,
        "seconds": time.perf_counter() - start,
        "peak_GiB": memory.peak / 2**30,
        "weights_and_state_GiB": static / 2**30,
    }
    if device.type == "cuda":
        result["cuda_max_allocated"] = torch.cuda.max_memory_allocated(device) / 2**30
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, nargs="+", default=[8192], help="tokens per sequence")
    parser.add_argument("--batch", type=int, default=1, help="sequences per micro-batch")
    parser.add_argument("--lora", action="store_true")
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)  # a single measurement, in this process
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if args.one:
        print(json.dumps(micro_step(args.tokens[0], args.batch, args.lora, device)))
        return
    for tokens in args.tokens:  # a fresh process each: peaks do not carry over
        command = [sys.executable, __file__, "--one", "--tokens", str(tokens), "--batch", str(args.batch)]
        result = json.loads(
            subprocess.run(
                command + (["--lora"] if args.lora else []), check=True, capture_output=True, text=True
            ).stdout
        )
        allocator = (
            f"; CUDA allocator peak {result['cuda_max_allocated']:.2f} GiB" if "cuda_max_allocated" in result else ""
        )
        print(
            f"{result['method']:>4}, {result['batch']} x {tokens} tokens on {result['device']}: "
            f"peak {result['peak_GiB']:.2f} GiB of tensors, {result['weights_and_state_GiB']:.2f} of them weights "
            f"and optimizer state{allocator} ({result['trainable_M']:.1f}M of {result['parameters_M']:.0f}M "
            f"parameters trained, {result['seconds']:.0f} s)"
        )


if __name__ == "__main__":
    main()
