# The two commands of the README. Both set everything up first (idempotent), then run.
VENV ?= .venv
SLOSCOPE := $(VENV)/bin/sloscope

.PHONY: setup demo test image
setup:
	@bash scripts/setup.sh

# The demo installs what it needs (the server, the live demo's tools); the tests install everything.
demo:
	@bash scripts/setup.sh --demo
	@$(SLOSCOPE) demo

test: setup
	@$(VENV)/bin/python -m pytest -q

# The images localhost/sloscope-agent:VERSION and localhost/sloscope:VERSION (Containerfile), built with
# Debian's debootstrap and podman, as root.
image:
	@bash scripts/build-image.sh
