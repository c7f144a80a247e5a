# callbridge: the two set-up commands are `make run` and `make test`.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
CONFIG ?= config/callbridge.toml
# Debian packages the tests use as real peers (PEERS), one binary of each (PEER_BINS, in step).
PEERS := sip-tester baresip kamailio haproxy tshark sox espeak-ng iproute2 systemd iptables conntrack
PEER_BINS := sipp baresip kamailio haproxy tshark sox espeak-ng ip systemd-analyze iptables conntrack
# Debian packages the tests use for a file rather than a binary (PEER_FILE_PACKAGES), and
# that file as NEED=PATH (PEER_FILES, in step; NEED is the name in @pytest.mark.needs).
PEER_FILE_PACKAGES := kamailio-tls-modules
PEER_FILES := kamailio_tls=/usr/lib/x86_64-linux-gnu/kamailio/modules/tls.so

.PHONY: run test venv native peers lint typecheck config-reference unit bench bench-quick soak fuzz install clean

# The install compiles the media hot path with mypyc (setup.py, docs/native.md):
# a C compiler and the Python headers are needed; CALLBRIDGE_PURE_PYTHON=1 skips it.
$(VENV)/.installed: pyproject.toml setup.py
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	$(PIP) install --quiet -e '.[local-tts,test]'
	touch $@

## The compiled modules rebuilt if a source changed since they were built (bridge/native.py).
native: $(VENV)/.installed
ifeq ($(CALLBRIDGE_PURE_PYTHON),1)
	@$(PY) -m bridge.native --clean
else
	@$(PY) -m bridge.native --check >/dev/null || $(PIP) install --quiet --no-deps -e .
endif

venv: native

## make run: set up and run the daemon with the embedded Piper voice and the demo flow.
run: venv
	$(VENV)/bin/callbridge serve --config $(CONFIG)

## make test: set up and run every test (lint, types, unit, loopback with real peers).
test: venv peers lint typecheck
	$(PY) -m pytest -q

## Install the Debian test peers when running as root and they are missing.
peers:
	@missing=""; for b in $(PEER_BINS); do command -v $$b >/dev/null || missing="$$missing $$b"; done; \
	for f in $(PEER_FILES); do test -e "$${f#*=}" || missing="$$missing $${f#*=}"; done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    echo "installing test peers (missing:$$missing)"; \
	    export DEBIAN_FRONTEND=noninteractive; \
	    apt-get update -q >/dev/null && apt-get install -y -q --no-install-recommends $(PEERS) $(PEER_FILE_PACKAGES) >/dev/null; \
	  else \
	    echo "note: not root, test peers missing:$$missing (tests that need them will say so)"; \
	  fi; \
	fi

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

# config/README.md's key tables, from the settings' fields (bridge/config.py, bridge/settings.py)
config-reference: venv
	$(VENV)/bin/python -m bridge.config --write config/README.md

typecheck: venv
	$(VENV)/bin/mypy --strict codecs/telcodec bridge/engine.py bridge/commands.py bridge/addresses.py bridge/config.py bridge/settings.py bridge/sip bridge/rtp bridge/streams bridge/media bridge/ttsd bridge/control bridge/providers bridge/io/dns.py bridge/io/gcpolicy.py bridge/io/fdtable.py bridge/io/services.py bridge/io/ticker.py bridge/io/callrun.py bridge/io/legs/sip_call.py bridge/io/legs/stream_call.py bridge/io/httpws.py bridge/io/provider_ws.py bridge/io/provider_pool.py bridge/io/provider_turns.py bridge/io/session_http.py bridge/io/ws_client.py

unit: venv
	$(PY) -m pytest -q -m "not slow and not peers"

## make soak: 10 000 mixed calls (SIP and media streams, barge-ins, DTMF, provider
## failures: kills and mid-turn faults) against one daemon, then every resource back to
## baseline (not in `make test`); CALLS=500 runs fewer, SOAK_ARGS passes other options.
soak: venv
	$(PY) -m bench.bench_soak $(if $(CALLS),--calls $(CALLS)) $(SOAK_ARGS)

## make fuzz: every coverage-guided fuzz target of bench/fuzz/ (atheris, the bench extra)
## for FUZZ_RUNS inputs each, seeded from the test fixtures (not in `make test`); crash
## inputs land in bench/results/fuzz/. Longer runs: python -m bench.fuzz.fuzz_sip -max_total_time=600.
FUZZ_RUNS ?= 20000
FUZZ_TARGETS := sip sdp digest streams app providers
$(VENV)/.fuzz: pyproject.toml $(VENV)/.installed
	$(PIP) install --quiet -e '.[local-tts,test,bench]'
	touch $@

fuzz: venv $(VENV)/.fuzz
	set -e; for t in $(FUZZ_TARGETS); do \
	  echo "fuzz_$$t: $(FUZZ_RUNS) runs"; \
	  $(PY) -m bench.fuzz.fuzz_$$t -atheris_runs=$(FUZZ_RUNS); \
	done

## Install as a system service under /opt/callbridge (see docs/deployment.md).
install:
	bash scripts/install.sh

## Benchmark extras: PESQ and py-spy in the project venv, Pipecat in its own venv.
$(VENV)/.bench: pyproject.toml $(VENV)/.installed
	$(PIP) install --quiet -e '.[local-tts,test,bench]'
	$(PYTHON) -m venv bench/.venv-pipecat
	bench/.venv-pipecat/bin/pip install --quiet 'pipecat-ai[websocket]' 'uvicorn<1'
	touch $@

bench: venv peers $(VENV)/.bench
	$(PY) -m bench.run_all

bench-quick: venv peers $(VENV)/.bench
	$(PY) -m bench.run_all --quick

clean:
	rm -rf $(VENV) build *.egg-info .mypy_cache .ruff_cache .pytest_cache
	find bridge -name '*.so' -delete; rm -f callbridge_native__mypyc*.so
