# gpufleet: `make demo` and `make test` do all set-up on a fresh machine (Python 3.11+, Node 22 LTS).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# Twice the cores: the embedded account's tests spend about half their time waiting on its paced
# clock (tests/integration/test_demo.py: 79 s of wall time for 44 s of CPU), so two workers a core
# keep both busy (the suite's pytest: 5m48s with 4 workers on 2 cores on 2026-12-04).
PYTEST_WORKERS ?= 4
# Node 22 LTS is the prerequisite; this only quiets jsii on a machine still running Node 20.
export JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION := 20

.PHONY: help install demo test lint typecheck unit integration realtime infra synth bench simulate lock clean browser

help:
	@echo "make demo       run sample jobs end to end on the embedded AWS account"
	@echo "make test       lint, type-check and run every test but the real-time ones"
	@echo "make browser    install Debian's chromium when missing (the HTML pages' tests load them)"
	@echo "make realtime   run the real-time tests (whole chaos runs)"
	@echo "make synth      synthesize the CDK stack into cdk.out/"
	@echo "make bench      print selection, admission, simulator, per-job overhead, cold-start, metric-action and review figures"
	@echo "make simulate   replay a week of the Philly trace; report in build/sim-report"

$(STAMP): pyproject.toml requirements.lock
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -c requirements.lock -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/gpufleet demo

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy

# The HTML pages gpufleet writes are checked in headless Chromium (tests/browser): Debian's
# package, installed when missing (as root, or through sudo).
browser:
	@command -v chromium >/dev/null 2>&1 || { \
		if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi; \
		$$SUDO apt-get update && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y --no-install-recommends chromium; }

# Chromium's download overlaps the lint and the type-check (one core each, or the network).
test: $(STAMP)
	$(MAKE) --no-print-directory -j3 lint typecheck browser
	$(BIN)/pytest -q -n $(PYTEST_WORKERS) --dist loadfile

unit: $(STAMP)
	$(BIN)/pytest -q tests/unit

integration: $(STAMP)
	$(BIN)/pytest -q -n $(PYTEST_WORKERS) --dist loadfile tests/integration

# The real-time tests (whole chaos runs on the embedded account), which `make test` leaves out.
realtime: $(STAMP)
	$(BIN)/pytest -q -m realtime

infra: $(STAMP)
	$(BIN)/pytest -q tests/infrastructure

synth: $(STAMP)
	$(BIN)/python infra/app.py
	@echo "template: cdk.out/GpuFleetStack.template.json"

# The CDK CLI version package.json pins, in node_modules/: `npx cdk` runs it (docs/deploy.md).
.PHONY: cdk-cli
cdk-cli: package.json
	npm install --no-audit --no-fund
	npx --no-install cdk --version

bench: $(STAMP)
	$(BIN)/python scripts/bench_selection.py
	$(BIN)/python scripts/bench_admission.py
	$(BIN)/python scripts/bench_simulator.py
	$(BIN)/python scripts/bench_overhead.py
	$(BIN)/python scripts/bench_cold_start.py
	$(BIN)/python scripts/bench_metric_actions.py
	$(BIN)/python scripts/bench_review.py

simulate: $(STAMP)
	$(BIN)/gpufleet simulate --format philly --start-days 30 --days 7 --report build/sim-report

lock:
	(grep '^#' requirements.lock; $(BIN)/python -m pip freeze --exclude-editable | grep -v '^gpufleet') \
		> requirements.lock.new
	mv requirements.lock.new requirements.lock

clean:
	rm -rf $(VENV) cdk.out build .mypy_cache .ruff_cache .pytest_cache .hypothesis
