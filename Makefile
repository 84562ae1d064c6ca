# gpinfer: `make run` (set up + default experiment) and `make test` (set up + lint + tests).
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
BIN    := $(VENV)/bin
PLUGINS := $(sort $(wildcard plugins/*/pyproject.toml))
STAMP  := $(VENV)/.installed

.PHONY: install run test lint ui clean

install: $(STAMP)

$(STAMP): pyproject.toml $(PLUGINS)
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e ".[dev]" $(foreach p,$(PLUGINS),-e $(dir $(p)))
	@touch $(STAMP)

run: install
	$(BIN)/gpinfer-run $(ARGS)

lint: install
	$(BIN)/ruff check .

test: lint
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

ui: install
	$(BIN)/mlflow ui --backend-store-uri sqlite:///$(CURDIR)/outputs/mlflow.db --host 127.0.0.1 --port 5000

clean:
	rm -rf $(VENV) outputs/* .pytest_cache .ruff_cache
