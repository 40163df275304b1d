# The two commands of the README. Both set everything up first (idempotent), then run.
VENV ?= .venv
SLOSCOPE := $(VENV)/bin/sloscope

.PHONY: setup demo test
setup:
	@bash scripts/setup.sh

demo: setup
	@$(SLOSCOPE) demo

test: setup
	@$(VENV)/bin/python -m pytest -q
