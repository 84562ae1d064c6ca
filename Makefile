# gpinfer: `make run` (set up + default experiment), `make test` (set up + lint + types + tests),
# `make docs` (the docs site into site/, warnings as errors).
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
BIN    := $(VENV)/bin
PLUGINS := $(sort $(wildcard plugins/*/pyproject.toml))
STAMP  := $(VENV)/.installed
# PyTorch for the torch backend's tests (`make test` only; `make run` does not need it): the
# CPU build, which pip takes from this machine's wheel files; plain `torch` or a newer version
# would download a CUDA build of several GB
TORCH  ?= torch==2.13.0
TORCH_STAMP := $(VENV)/.torch
DOCS_STAMP := $(VENV)/.docs
# the oldest Python gpinfer supports (pyproject.toml: requires-python)
PY_OK  := import sys; sys.exit(sys.version_info < (3, 11))
# `make ui PORT=5001 HOST=0.0.0.0`
PORT   ?= 5000
HOST   ?= 127.0.0.1

.PHONY: install torch run test lint typecheck docs ui clean

# A .venv made by an unsupported (or since removed) Python is rebuilt; outputs/ is kept.
install:
	@$(BIN)/python -c "$(PY_OK)" 2>/dev/null || test ! -e $(VENV) || { \
	  echo "$(VENV) was made by an unsupported or missing Python: rebuilding it"; rm -rf $(VENV); }
	@$(MAKE) -s --no-print-directory $(STAMP)

# pip's output goes to $(VENV)/install.log and is shown only when the install fails
$(STAMP): pyproject.toml setup.py $(PLUGINS)
	@$(PYTHON) -c "$(PY_OK)" || { echo "gpinfer needs Python >= 3.11; $(PYTHON) is \
	  $$($(PYTHON) -V 2>&1). Run: make PYTHON=/path/to/python3.11 ..."; exit 1; }
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@echo "installing gpinfer and its plugins into $(VENV) (log: $(VENV)/install.log)"
	@{ $(BIN)/python -m pip install --upgrade pip && \
	   $(BIN)/python -m pip install -e ".[dev]" $(foreach p,$(PLUGINS),-e $(dir $(p))); \
	 } > $(VENV)/install.log 2>&1 || { tail -n 30 $(VENV)/install.log; \
	   echo "make install failed: see $(VENV)/install.log"; exit 1; }
	@touch $(STAMP)

# into the same venv, pip's output appended to $(VENV)/install.log (shown only on failure)
$(TORCH_STAMP): $(STAMP)
	@echo "installing $(TORCH) (CPU build) for the torch backend's tests (log: $(VENV)/install.log)"
	@$(BIN)/python -m pip install "$(TORCH)" >> $(VENV)/install.log 2>&1 || { \
	   tail -n 30 $(VENV)/install.log; echo "installing $(TORCH) failed: see $(VENV)/install.log"; \
	   exit 1; }
	@touch $(TORCH_STAMP)

torch: install
	@$(MAKE) -s --no-print-directory $(TORCH_STAMP)

# the docs extra (MkDocs Material, mkdocstrings) into the same venv, pip's output appended to
# $(VENV)/install.log (shown only on failure)
$(DOCS_STAMP): $(STAMP)
	@echo "installing the docs tools (gpinfer[docs]; log: $(VENV)/install.log)"
	@$(BIN)/python -m pip install -e ".[docs]" >> $(VENV)/install.log 2>&1 || { \
	   tail -n 30 $(VENV)/install.log; echo "installing gpinfer[docs] failed: see $(VENV)/install.log"; \
	   exit 1; }
	@touch $(DOCS_STAMP)

# the site into site/ (not committed; open site/index.html), any warning an error (mkdocs.yml:
# strict); the method options page is generated from every method's option_spec
docs: install
	@$(MAKE) -s --no-print-directory $(DOCS_STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --clean

run: install
	$(BIN)/gpinfer-run $(ARGS)

lint: install
	$(BIN)/ruff check .

# mypy on gpinfer/ and the plugins' packages ([tool.mypy] in pyproject.toml)
typecheck: install
	$(BIN)/mypy

# torch first: lint and mypy see the same packages as the tests
test: torch lint typecheck
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

ui: install
	$(BIN)/mlflow ui --backend-store-uri sqlite:///$(CURDIR)/outputs/mlflow.db \
	  --host $(HOST) --port $(PORT)

clean:
	rm -rf $(VENV) outputs/* site .pytest_cache .ruff_cache
