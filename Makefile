# Two entry points do all the set-up on a fresh Debian/Ubuntu machine:
#   make demo   runs edge-agent on a reference model and a sample photo
#   make test   lint, types and the whole test suite
# Both create .venv and install what they need; system packages come from
# tools/system-deps.sh (apt-get when root, otherwise it prints the command).

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
export EDGE_AGENT_CACHE ?= $(CURDIR)/.cache/edge-agent

.PHONY: demo test check install system-deps clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[test,lint]'
	touch $@

install: $(VENV)/.installed

system-deps:
	bash tools/system-deps.sh

demo: install
	$(BIN)/python tools/samples.py --out .cache/samples
	$(BIN)/edge-agent models fetch person-ssdlite
	$(BIN)/edge-agent infer --model person-ssdlite --input .cache/samples/astronaut.png

check: install
	$(BIN)/ruff check edge_agent tests tools calibration
	$(BIN)/ruff format --check edge_agent tests tools calibration
	$(BIN)/mypy

test: system-deps check
	$(BIN)/pytest -q

clean:
	rm -rf $(VENV) .cache .mypy_cache .pytest_cache .ruff_cache
