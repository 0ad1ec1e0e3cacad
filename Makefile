# Two entry points (see README): `make run` and `make test`. Both install into .venv/ when needed.
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(VENV)/bin/pip
STAMP  := $(VENV)/.installed
ARGS   ?= workload=resnet optimizer=wagma

.PHONY: setup run test lint
setup: $(STAMP)

# torch/torchvision first: the exact builds on this machine's disk (pip would otherwise pull a second
# multi-GB build). The project itself is installed editable with its dev extras.
$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q torch==2.14.1 torchvision==0.29.1
	$(PIP) install -q -e '.[dev]'
	touch $@

run: $(STAMP)
	$(VENV)/bin/wagma-bench run $(ARGS)

test: $(STAMP)
	$(VENV)/bin/pytest -q

lint: $(STAMP)
	$(VENV)/bin/ruff check wagma_bench tests
