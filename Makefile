# csbench — every target sets up what it needs on a fresh clone (.venv, cached kube-apiserver build).
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# Never let the repository root shadow the standard library (operator/ is a folder here).
export PYTHONSAFEPATH := 1

.PHONY: dev system-deps test lint typecheck demo bench clean

$(STAMP): pyproject.toml
	@echo "==> creating $(VENV) and installing csbench[dev] (first run only)"
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@$(BIN)/pip install -q -U pip
	@$(BIN)/pip install -q -e '.[dev]'
	@touch $@

dev: $(STAMP)

# Debian packages the tests and benches drive (chromium for the report, wrk as the raw-load peer).
system-deps:
	@.ci/install-system-deps

lint: dev
	$(BIN)/ruff check .
	@$(MAKE) --no-print-directory typecheck

# mypy cannot follow setuptools' package-dir mapping, so check a tree of links shaped like the installed package.
typecheck: dev
	@rm -rf build/typecheck && mkdir -p build/typecheck/csbench
	@for f in csbench/*; do [ -L "$$f" ] || [ "$${f##*/}" = __pycache__ ] || ln -s $(CURDIR)/$$f build/typecheck/csbench/; done
	@ln -s $(CURDIR)/operator build/typecheck/csbench/operator
	@ln -s $(CURDIR)/probe build/typecheck/csbench/probe
	@ln -s $(CURDIR)/localcloud build/typecheck/csbench/localcloud
	cd build/typecheck && ../../$(BIN)/mypy --config-file ../../pyproject.toml -p csbench

test: lint system-deps
	$(BIN)/pytest

demo: dev
	$(BIN)/csbench demo

bench: dev system-deps
	$(BIN)/python bench/run.py

clean:
	rm -rf build .pytest_cache .mypy_cache .ruff_cache
