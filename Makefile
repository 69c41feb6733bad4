# Set-up and test entry points. `make quickstart` and `make test` are the two
# commands in the README; .ci/run calls `make test`.
#
# The venv is (re)installed only when pyproject.toml changes: the stamp file
# .venv/.installed records the last successful install. pip finds the CPU
# torch wheel through the machine's pip configuration (PIP_FIND_LINKS).
#
# The Debian packages the tests need (tools/debian-packages.sh: headless
# Chromium for tests/test_report.py) are installed by `make test` when it
# runs as root (CI); as any other user the script only names what is missing.

PYTHON ?= $(shell command -v python3.11 2>/dev/null || command -v python3)
VENV := .venv
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=
# the tests start hundreds of Python processes (workers, CLI runs): with
# bytecode caching off in the environment each compiles every module it
# imports, and pytest rewrites every test module again, in each process
TEST_ENV := env -u PYTHONDONTWRITEBYTECODE

# hypothesis: the thorough `ci` profile when CI is set (CI=true in CI runs)
HYPOTHESIS_PROFILE ?= $(if $(CI),ci,dev)
export HYPOTHESIS_PROFILE

.PHONY: quickstart test soak venv clean debian-packages

venv: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install -e '.[test]' --config-settings editable_mode=compat
	touch $(STAMP)

quickstart: $(STAMP)
	$(VENV)/bin/rollcall run scenarios/quickstart.yaml --target sim

debian-packages:
	if [ "$$(id -u)" -eq 0 ]; then tools/debian-packages.sh; fi

test: $(STAMP) debian-packages
	$(TEST_ENV) $(VENV)/bin/python -m pytest -n 2 --dist loadgroup -p no:cacheprovider -m "not slow and not soak" tests/ $(PYTEST_ARGS)
	$(TEST_ENV) $(VENV)/bin/python -m pytest -n 2 --dist loadgroup -p no:cacheprovider -m "slow and not soak" tests/ $(PYTEST_ARGS) || [ $$? -eq 5 ]

soak: $(STAMP) debian-packages
	$(TEST_ENV) $(VENV)/bin/python -m pytest -n 2 --dist loadgroup -p no:cacheprovider -m soak tests/ $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) runs .hypothesis
