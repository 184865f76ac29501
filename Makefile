# spotrelay — every target sets itself up: a venv from the lock file, then the package.
PYTHON ?= python3.11
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
TEMPLATE := cdk.out/SpotRelay.template.json

# Python's bytecode cache, kept inside the venv. A machine that sets PYTHONDONTWRITEBYTECODE (this one
# does) has every process compile moto, botocore and the CDK from source again: every process that
# imports the local runtime, and every synth, would pay for it.
export PYTHONPYCACHEPREFIX := $(abspath $(VENV))/pycache
unexport PYTHONDONTWRITEBYTECODE

.PHONY: demo test lint format typecheck unit synth bench-place bench-agent lock clean

# uv installs the lock file exactly as pip would (the same hashes), in seconds instead of two minutes.
UV_VERSION := 0.13.9
UV := $(BIN)/uv pip install --python $(BIN)/python --quiet

$(STAMP): requirements.lock pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@$(BIN)/python -m pip install --quiet uv==$(UV_VERSION) 2>&1 | grep -v "^WARNING: Location" || true
	$(UV) --require-hashes -r requirements.lock
	$(UV) --no-deps -e .
	@$(BIN)/python -c "import spotrelay, pydantic, typer" # fail here, not later, if the install broke
	@touch $@

## demo: the whole system on moto - the synthesized stack, the flagship scenario on a virtual clock:
## jobs interrupted, checkpointed and relaunched on the next-cheapest pools; timeline and cost report
demo: $(STAMP) node_modules $(TEMPLATE)
	$(BIN)/spotrelay replay events/scenarios/flagship.yaml

# The template the replay deploys: synthesized when missing or older than the CDK app (make synth).
$(TEMPLATE): $(STAMP) node_modules app.py cdk.json $(wildcard stacks/*.py) spotrelay/config.py
	$(MAKE) synth

## test: lint, type-check and synthesize side by side (two cores), then run the whole test suite
test: $(STAMP) node_modules
	@$(MAKE) --no-print-directory -j3 --output-sync=target lint typecheck synth
	@$(MAKE) --no-print-directory unit

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy

# Two workers, handed one test at a time (--maxschedchunk 1) in the order tests/conftest.py sets: the longest
# first (the scenario replays, then what tests/durations.json lists), so that neither worker is left with a
# long test at the end while the other idles. By default xdist hands each worker a quarter of the suite at
# once, which put every replay on the same worker. `--record-durations tests/durations.json` refreshes the list.
unit: $(STAMP)
	$(BIN)/pytest -q -n 2 --dist load --maxschedchunk 1

## node_modules: the pinned aws-cdk CLI (package-lock.json), installed exactly
node_modules: package.json package-lock.json
	npm ci --no-audit --no-fund
	@touch $@

# Every run of the CDK CLI: its telemetry, version check and notices would reach for the network; jsii warns
# that node 20 is past its end of life, and the CLI's AWS SDK that its releases after January 2027 need node 22:
# both known (node 20 is this project's), so both are silenced
CDK_ENV = CDK_DISABLE_CLI_TELEMETRY=1 CDK_DISABLE_VERSION_CHECK=1 JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION=20 \
	AWS_SDK_JS_NODE_VERSION_SUPPORT_WARNING_DISABLED=true

## synth: the CloudFormation template into cdk.out, offline (no credentials, no lookups), then cfn-lint
# cdk-nag (AwsSolutions) runs inside the synth and fails it on any unacknowledged finding. CDK_VALIDATION=false
# skips CDK's built-in CloudFormation validation (seconds of CPU) only because cfn-lint checks the same
# template right after; `cdk deploy` keeps it.
synth: $(STAMP) node_modules
	$(CDK_ENV) CDK_VALIDATION=false npx cdk synth --no-notices -q
	$(BIN)/cfn-lint cdk.out/*.template.json

## deploy-local: `cdk deploy` with the pinned CLI against `spotrelay local up` (LOCAL_ENDPOINT, default its port
## 5055; STACK=name deploys under another name: the commands then take --stack name)
LOCAL_ENDPOINT ?= http://localhost:5055
STACK ?= SpotRelay
.PHONY: deploy-local
deploy-local: $(STAMP) node_modules
	@$(BIN)/python -c "import socket, sys, urllib.parse as p; u = p.urlsplit('$(LOCAL_ENDPOINT)'); \
	socket.create_connection((u.hostname, u.port or 80), timeout=5).close()" 2>/dev/null \
	|| { echo "error: nothing answers at $(LOCAL_ENDPOINT): start \`spotrelay local up\` first (LOCAL_ENDPOINT=...)"; exit 1; }
	AWS_ENDPOINT_URL=$(LOCAL_ENDPOINT) AWS_REGION=$${AWS_REGION:-us-east-1} AWS_DEFAULT_REGION=$${AWS_REGION:-us-east-1} \
	AWS_ACCESS_KEY_ID=testing AWS_SECRET_ACCESS_KEY=testing AWS_SESSION_TOKEN= AWS_PROFILE= \
	$(CDK_ENV) npx cdk deploy --no-notices --require-approval never -c stack_name=$(STACK)

## deploy: `cdk deploy` to your AWS account (its credentials and region, as the AWS CLI finds them) with the pinned
## CLI; STACK=name; CDK_ARGS='-c vpc_id=... -c subnets=[...]' for the stack's context (stacks/config.py)
CDK_ARGS ?=
.PHONY: deploy
deploy: $(STAMP) node_modules
	$(CDK_ENV) npx cdk deploy --no-notices -c stack_name=$(STACK) $(CDK_ARGS)

format: $(STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

## bench-place: time placement over a 100-type x 6-AZ price table
bench-place: $(STAMP)
	$(BIN)/python -m spotrelay.policy.bench_placement

## bench-replay: replay speed (simulated hours per wall second), flagship scenario and the 50-job burst
.PHONY: bench-replay
bench-replay: $(STAMP) node_modules $(TEMPLATE)
	$(BIN)/python -m spotrelay.local.bench_replay

## scenarios: every scenario of events/scenarios replayed (burst-50 included, which `make test` replays as
## burst-12), with its replay speed; fails if an expectation or an invariant of any does
.PHONY: scenarios
scenarios: $(STAMP) node_modules $(TEMPLATE)
	$(BIN)/python -m spotrelay.local.bench_replay events/scenarios/*.yaml

## load: 1,000 jobs submitted at once and 10,000 foreign EC2 events in an hour, replayed (spotrelay/local/load.py);
## fails if a job does not succeed, an invariant breaks, or admission leaves priority order or the quota
LOAD_JOBS ?= 1000
LOAD_EVENTS ?= 10000
.PHONY: load
load: $(STAMP) node_modules $(TEMPLATE)
	$(BIN)/python -m spotrelay.local.load --jobs $(LOAD_JOBS) --events $(LOAD_EVENTS)

## chaos: fault injection (spotrelay/local/chaos.py), seeds CHAOS_SEEDS x CHAOS_SCENARIOS, two replays at a time;
## fails on any broken invariant and lists each failing seed's `spotrelay replay ... --chaos SEED`
CHAOS_SEEDS ?= 1-200
CHAOS_SCENARIOS ?= events/scenarios/happy-path.yaml events/scenarios/duplicate-reordered.yaml
.PHONY: chaos
chaos: $(STAMP) node_modules $(TEMPLATE)
	$(BIN)/python -m spotrelay.local.chaos --seeds $(CHAOS_SEEDS) --processes 2 $(CHAOS_SCENARIOS)

## bench-agent: time from a spot notice to the committed checkpoint of a 1 GiB checkpoint dir (moto server)
bench-agent: $(STAMP)
	$(BIN)/python -m spotrelay.agent.bench

## bench: the cost benchmark on the shared spot traces (DATA, ../shared/data by default): all policies -> BENCHMARKS.md
DATA ?= ../shared/data
.PHONY: bench
bench: $(STAMP)
	$(BIN)/python -m spotrelay.bench.suite --data $(DATA) --out BENCHMARKS.md

## lock: re-resolve requirements.lock from pyproject.toml (needs network to PyPI)
lock:
	$(BIN)/python -m pip install --quiet uv==$(UV_VERSION)
	$(BIN)/uv pip compile pyproject.toml --all-extras --python-version 3.11 --generate-hashes -o requirements.lock

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis cdk.out
