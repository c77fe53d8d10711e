# Two entry points do all the set-up on a fresh Debian/Ubuntu machine:
#   make demo   the agent end to end: broker, fleet, deploy over MQTT, a live pipeline
#   make test   lint, types and the whole test suite (Hypothesis derandomized: reproducible)
#   make fuzz   the unit tests with many fresh random Hypothesis examples, run by hand
# Both create .venv and install what they need; system packages come from
# tools/system-deps.sh (apt-get when root, otherwise it prints the command).

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
export EDGE_AGENT_CACHE ?= $(CURDIR)/.cache/edge-agent

.PHONY: demo test fuzz check install system-deps clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[test,lint,demo]'
	touch $@

install: $(VENV)/.installed

system-deps:
	bash tools/system-deps.sh

# mosquitto when it can be installed (root); otherwise the demo runs its embedded broker.
demo: install
	bash tools/system-deps.sh --demo
	$(BIN)/edge-agent demo $(DEMO_ARGS)

check: install
	$(BIN)/ruff check edge_agent tests tools calibration setup.py
	$(BIN)/ruff format --check edge_agent tests tools calibration setup.py
	$(BIN)/mypy

# The "ci" profile (tests/conftest.py): the same examples every run and no example database,
# so a fresh clone passes or fails the same way every time. --durations: the slowest tests,
# in every run, against the 15-minute budget.
test: system-deps check
	HYPOTHESIS_PROFILE=ci $(BIN)/pytest -q --durations=15

# Random search for what the fixed examples miss; FUZZ_EXAMPLES per property (default 2000).
# A failure prints its reproduce blob; turn it into an explicit test before fixing it.
fuzz: install
	HYPOTHESIS_PROFILE=fuzz $(BIN)/pytest -q tests/unit

clean:
	rm -rf $(VENV) .cache .mypy_cache .pytest_cache .ruff_cache
