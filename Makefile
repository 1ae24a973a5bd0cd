# Two entry points (see README): `make quickstart` and `make test`. Both create .venv first.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: quickstart test test-all bench clean

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	# torch first and pinned: the CPU wheel on disk; an unpinned torch would pull a CUDA build.
	$(VENV)/bin/pip install --quiet torch==2.13.0
	$(VENV)/bin/pip install --quiet -e '.[dev]'
	touch $(STAMP)

quickstart: $(STAMP)
	$(PY) -m reasonrl.cli quickstart $(ARGS)

test: $(STAMP)
	$(PY) -m pytest $(ARGS)

bench: $(STAMP)
	$(PY) benchmarks/embedded_throughput.py

clean:
	rm -rf $(VENV) runs .pytest_cache
