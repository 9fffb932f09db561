# The two commands that work on a fresh machine with Python 3.11 and make:
#   make demo   - venv, install, a real search on synthetic data, where to look at the results
#   make test   - venv, install with test extras, the test suite
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   ?= .venv
BIN    := $(VENV)/bin
# TensorFlow flavour: cpu (tensorflow-cpu, laptops/CI) or gpu (tensorflow[and-cuda], GPU nodes)
TF     ?= cpu
DEMO_OUT ?= runs/demo
# parallel pytest workers for make test: most tests wait on processes (Ray, servers, SLURM) more than
# they compute, so two workers on 2 cores; each worker runs whole modules (--dist loadscope), so a
# module's shared fixture (a search, a SLURM cluster) is built once. xdist's own order (most tests
# first) is kept: starting the longest modules first ran the two heaviest side by side and took
# 37 min against 31 (measured in a clean clone, see tests/conftest.py's per-module summary)
TEST_WORKERS ?= 2

.PHONY: demo test test-stress docs-commands lint install clean

$(BIN)/.installed-$(TF): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[$(TF),test]'
	rm -f $(BIN)/.installed-*
	touch $@

install: $(BIN)/.installed-$(TF)

demo: install
	@echo "== distmis demo: quickstart search on synthetic MSD-layout data (data cached in ./data)"
	rm -rf $(DEMO_OUT)
	DISTMIS_DATA_HOME=$(CURDIR)/data $(BIN)/distmis tune search_spaces/quickstart.yaml --out $(DEMO_OUT)
	@echo "== the 2 best configurations cross-validated on 3 folds; their fold models become an ensemble (final/)"
	DISTMIS_DATA_HOME=$(CURDIR)/data $(BIN)/distmis finalize $(DEMO_OUT) --top 2 --folds 3
	@echo "== the best trial's model and the ensemble on the held-out test cases (raw NIfTI in, segmentation NIfTI out)"
	DISTMIS_DATA_HOME=$(CURDIR)/data $(BIN)/distmis evaluate $(DEMO_OUT)/best --split test
	DISTMIS_DATA_HOME=$(CURDIR)/data $(BIN)/distmis evaluate $(DEMO_OUT)/final --split test
	@echo
	@echo "== where to look"
	@echo "  results table:     $(DEMO_OUT)/results.csv"
	@echo "  best config:       $(DEMO_OUT)/best.yaml   (retrain it: $(BIN)/distmis train $(DEMO_OUT)/best.yaml)"
	@echo "  best weights:      $(DEMO_OUT)/best/"
	@echo "  cross-validation:  $(DEMO_OUT)/finalize/report.html (selection bias, cv.csv, plots/)"
	@echo "  ensemble model:    $(DEMO_OUT)/final/ (predict and evaluate take it as they take best/)"
	@echo "  test-set scores:   $(DEMO_OUT)/evaluate-test/ (best/), $(DEMO_OUT)/evaluate-final-test/ (final/)"
	@echo "  per-trial curves:  $(DEMO_OUT)/trials/<id>/metrics.csv, plots in $(DEMO_OUT)/plots/"
	@echo "  MLflow:            $(BIN)/distmis ui   -> http://127.0.0.1:5000  (store: runs/mlflow.db)"

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

test: lint
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadscope

# the process-heavy tests (Ray, trials, servers, SLURM) with one busy CPU hog beside them
test-stress: install
	$(BIN)/python tests/_support/stress.py

# every command the README and docs/ show, run as written on stand-ins (the suite runs the quick ones)
docs-commands: install
	$(BIN)/python tests/_support/documented.py --all

clean:
	rm -rf $(VENV) runs data .pytest_cache
