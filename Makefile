# kltutorial: build, run and test the book.
#
#   make book       the HTML book in _build/html, from the notebooks' committed outputs (executes nothing)
#   make test       lint, unit tests, nbval over every notebook (on a second kernel set),
#                   strict book build, browser check, PDF
#   make pdf        the book as one PDF, _build/pdf/book.pdf, the API reference left to the HTML
#   make notebooks  re-execute every notebook in place (refreshes the committed outputs)
#   make book-executed  execute the notebooks (jupyter-cache) and write the HTML book
#   make lab        JupyterLab on book/ with the project's virtual environment
#
# Only Python 3.11 and make are needed: the first target that needs the environment
# creates .venv and installs requirements.txt and the package into it.

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

# The interpreter that creates .venv (override with `make PYTHON=/path/to/python3.11`).
# Resolved here, before PATH gains .venv/bin below.
ifndef PYTHON
PYTHON := $(shell command -v python3.11 2>/dev/null || command -v python3 2>/dev/null)
endif
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

BUILD := _build
HTML := $(BUILD)/html
NOTEBOOKS = $(sort $(wildcard book/*.ipynb))

# The venv's tools come first; quiet two start-up notices that are not ours to fix.
export PATH := $(CURDIR)/$(BIN):$(PATH)
export VIRTUAL_ENV := $(CURDIR)/$(VENV)
export JUPYTER_PLATFORM_DIRS := 1
export PYDEVD_DISABLE_FILE_VALIDATION := 1
export KLTUTORIAL_HTML_DIR := $(CURDIR)/$(HTML)

.PHONY: help venv book book-executed test lint unit-tests unit-tests-twice nbval nbval-native nbval-second-kernels book-verified html-check html-check-desktop screenshots \
	html-check-phone lab-check \
	chromium notebooks lab clean pdf pdf-check pdf-tests mutation

help:
	@sed -n '3,9s/^# //p' Makefile

# ---------------------------------------------------------------------------
# Environment: rebuilt only when requirements.txt or pyproject.toml change.
venv: $(STAMP)

# torch comes first, from pip, because pip's configuration is where a machine names its CPU build of
# torch (find-links; on PyPI, 2.13.0 for Linux is the CUDA build); then uv (pinned here) installs the
# rest of requirements.txt, downloading in parallel (30 s where pip took 90), torch already satisfied.
# Every module is byte-compiled here: with PYTHONDONTWRITEBYTECODE set (as in CI), a process that
# imports an uncompiled module compiles it again every time. compileall's exit status is not checked:
# a few files of packages' own tests are written for newer Pythons (torch's py312_intrinsics.py),
# which pip and uv skip the same way.
UV_VERSION := 0.13.9
$(STAMP): requirements.txt pyproject.toml
	@test -n "$(PYTHON)" || { echo "error: python3.11 (or python3) not found" >&2; exit 1; }
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --no-compile uv==$(UV_VERSION) "$$(grep -E '^torch==' requirements.txt)"
	$(BIN)/python -m uv pip install --quiet --python $(BIN)/python --compile-bytecode -r requirements.txt
	$(BIN)/python -m compileall -qq -j 0 $(VENV)/lib >/dev/null || true
	$(BIN)/python -m uv pip install --quiet --python $(BIN)/python --no-deps -e .
	$(BIN)/python -m ipykernel install --sys-prefix --name kltutorial \
		--display-name "Python 3 (kltutorial)" >/dev/null
	touch $@

# ---------------------------------------------------------------------------
# The book. Every notebook is committed executed, and make test checks those outputs (nbval, on two
# kernel sets), so `make book` renders them as they are: the book's own config, as the conf.py that
# `jupyter-book config sphinx` writes from _config.yml, with execution switched off on sphinx-build's
# command line (-D); the prose's {eval} numbers come from the glued values stored in the notebooks.
# The generated conf.py (git-ignored; `jupyter-book build` never reads it) is removed after the build.
# It does not put the local extensions' folder on the path (jupyter-book #2210), hence PYTHONPATH=tools.
# $(1): sphinx-build's extra flags.
define render_book
	$(BIN)/jupyter-book config sphinx . >/dev/null
	PYTHONPATH=$(CURDIR)/tools$${PYTHONPATH:+:$$PYTHONPATH} $(BIN)/sphinx-build -b html \
		-d $(BUILD)/.doctrees -D nb_execution_mode=off $(1) . $(HTML) \
		|| { rc=$$?; rm -f conf.py; exit $$rc; }
	rm -f conf.py
endef

book: $(STAMP)
	$(call render_book,-q)
	@echo "Book written to $(HTML)/index.html"

# The same book with every notebook executed again first, through the jupyter-cache in
# _build/.jupyter_cache (a rebuild with unchanged code cells executes nothing).
book-executed: $(STAMP)
	$(BIN)/jupyter-book build . --path-output .
	@echo "Book written to $(HTML)/index.html"

# ---------------------------------------------------------------------------
# Tests. Each step is its own pytest run: the unit tests never execute notebooks,
# nbval never collects tests/*.py, and the browser check runs after the build.
# The environment and Chromium install side by side (pip and apt: downloads, mostly). nbval runs
# first, as the strict build shows its timings on the status page; then the unit tests (two workers)
# beside the strict build (one process) and the JupyterLab check (it reads the notebooks, not the
# HTML); then the browser checks (two processes, one per width) beside the PDF and its checks (which
# run while the browser checks finish). Each step keeps both cores busy to its end: on 2 cores the
# whole run needs about 1,100 core-seconds.
test:
	$(MAKE) --no-print-directory -j2 --output-sync=target venv chromium
	$(MAKE) --no-print-directory lint
	$(MAKE) --no-print-directory nbval
	$(MAKE) --no-print-directory -j3 --output-sync=target unit-tests book-verified lab-check
	$(MAKE) --no-print-directory -j2 --output-sync=target html-check pdf-check

# Ruff over the package, the tests, the tools and the notebooks' code (pyproject.toml, book/ruff.toml).
lint: $(STAMP)
	$(BIN)/ruff check .

# Unit tests and docstring examples of the package and the tools, and the stored notebooks' checks
# (tests/test_notebooks.py); not the browser checks (-m "not book"). Work stealing: a worker that runs
# out takes tests queued on the other, so that neither waits alone at the end.
# One OpenMP thread per worker: the tests' tensors are small, and make test runs the workers beside the
# strict build and JupyterLab on 2 cores, where each worker's second thread only waits for a core
# (measured on a fresh clone: that step 222 s with torch's default threads, 204 s with one).
unit-tests: $(STAMP)
	OMP_NUM_THREADS=1 $(call pytest_strict,$(XDIST) --dist worksteal tests kltutorial tools/nbval_numeric.py \
		--doctest-modules -m "not book" --durations=8)

# Unit tests and nbval run on up to four worker processes (pytest-xdist); nbval keeps each
# notebook on one worker (--dist loadfile), its cells in order in one kernel.
XDIST = -n auto --maxprocesses 4

# The unit tests twice in one process, serially (tools/run_twice.py): a test that changes what it shares
# fails the second time round. For maintainers (mutation tools run tests this way), not part of make test;
# about 6 minutes on 2 cores.
unit-tests-twice: $(STAMP)
	$(BIN)/python tools/run_twice.py tests kltutorial tools/nbval_numeric.py --doctest-modules -m "not book" \
		-p no:cacheprovider -q

# Strict nbval: every output of every code cell is compared with the stored one. Numbers
# are compared as numbers, within one unit of their last printed digit (tools/nbval_numeric.py,
# loaded by conftest.py); the sanitize file only masks values that genuinely vary between runs
# (memory addresses). make test runs it once, on a second kernel set (tools/second_kernels.py:
# torch's scalar ATen kernels, NumPy's baseline SIMD, MKL/oneDNN/OpenBLAS on SSE), so that an output
# only the producing CPU reproduces fails here, not on a reader's machine; the stored outputs come
# from this machine's native kernels, which `make nbval-native` checks on its own. Each pass that
# succeeds writes its notebooks' execution times to $(NBVAL_TIMES), for the book's status page
# (tools/nbval_timing.py, tools/status_page.py).
STATUS := $(BUILD)/status
NBVAL_TIMES = $(STATUS)/nbval-native.json
NBVAL_ARGS = $(XDIST) --dist loadfile --no-loadscope-reorder --nbval --nbval-current-env --nbval-cell-timeout=180 \
	--nbval-sanitize-with tests/nbval_sanitize.cfg -p no:cacheprovider --nbval-times=$(NBVAL_TIMES) \
	$(NBVAL_ORDER)
# Notebooks in reverse order: the experiments (sections 9 to 12) take the longest, and the workers take
# notebooks in the order given, so the longest start first and no worker waits alone at the end.
NBVAL_ORDER = $(shell printf '%s\n' $(NOTEBOOKS) | sort -r)

# nbval over every notebook, outputs compared numbers as numbers, on the second kernel set.
nbval: nbval-second-kernels

nbval-native: $(STAMP)
	@test -n "$(NOTEBOOKS)" || { echo "error: no notebooks in book/" >&2; exit 1; }
	$(call pytest_strict,$(NBVAL_ARGS))

nbval-second-kernels: $(STAMP)
	@test -n "$(NOTEBOOKS)" || { echo "error: no notebooks in book/" >&2; exit 1; }
	$(BIN)/python tools/second_kernels.py -- $(MAKE) --no-print-directory nbval-native \
		NBVAL_TIMES=$(STATUS)/nbval-second-kernels.json

# Render exactly the outputs nbval has just verified, strictly: warnings are errors (-W, all
# reported: --keep-going), nitpicky (-n); -E reads every page afresh so that no warning is hidden by an
# incremental build, and removing the old HTML first leaves no stale page behind for html-check.
book-verified: $(STAMP)
	rm -rf $(HTML)
	$(call render_book,-E -W -n --keep-going)

# Read the built book as readers do, in headless Chromium, offline, at desktop and phone
# width (tests/test_book_html.py: errors, requests, MathJax, wide content, images and
# figures, links, the ☰ button, the download menu, dark mode, search; screenshots in
# $(BUILD)/screenshots); the notebooks bundle, one chapter of it executed from the unpacked zip,
# and the status page (tests/test_book_downloads.py). JupyterLab is lab-check's, the PDF's checks
# pdf-check's.
# Two pytest processes side by side, each with its own Chromium: the pages at desktop width, and those
# at phone width with the checks that visit no page at a width (the phone marker, tests/conftest.py).
# Each keeps a core and a half busy on its own, so two halve the time on 2 cores.
HTML_CHECK = $(call pytest_strict,tests -m "book and not pdf and $(1)" --ignore=tests/test_jupyterlab.py \
	--durations=8)
html-check: $(STAMP) chromium
	$(MAKE) --no-print-directory -j2 --output-sync=target html-check-desktop html-check-phone

html-check-desktop: $(STAMP) chromium
	$(call HTML_CHECK,not phone)

html-check-phone: $(STAMP) chromium
	$(call HTML_CHECK,phone)

# The same checks with every page photographed whole (up to 12,000 px) at both widths, for a person to
# look through (_build/screenshots/); make test photographs each page's first screen only.
screenshots: $(STAMP) chromium
	KLTUTORIAL_FULL_SCREENSHOTS=1 $(MAKE) --no-print-directory html-check

# Open a MyST notebook in the venv's JupyterLab, in Debian's Chromium, and run it; then every chapter
# of book/ there, its {eval} numbers and figures shown (tests/test_jupyterlab.py). It reads the
# notebooks, not the HTML; make test runs it beside the unit tests and the strict build.
lab-check: $(STAMP) chromium
	$(call pytest_strict,tests/test_jupyterlab.py -m book --durations=4)

# The book as one PDF (tools/book_pdf.py leaves the API reference to the HTML), from the doctrees of
# the strict build (make test's; on a fresh checkout book-verified runs first), executing nothing:
# Sphinx's singlehtml builder writes the book as one page (-D as in book-verified), and
# tools/book_pdf.py prints it in Debian's Chromium once MathJax has
# typeset it, with the book's print style sheet (tools/static/kltutorial-print.css).
PDF_DIR := $(BUILD)/pdf
pdf: $(STAMP) chromium
	test -d $(BUILD)/.doctrees || $(MAKE) --no-print-directory book-verified
	rm -rf $(PDF_DIR)
	$(BIN)/jupyter-book config sphinx . >/dev/null
	PYTHONPATH=$(CURDIR)/tools$${PYTHONPATH:+:$$PYTHONPATH} $(BIN)/sphinx-build -b singlehtml -q \
		-d $(BUILD)/.doctrees -D nb_execution_mode=off -W -n --keep-going . $(PDF_DIR)/html \
		|| { rc=$$?; rm -f conf.py; exit $$rc; }
	rm -f conf.py
	$(BIN)/python tools/book_pdf.py $(PDF_DIR)/html $(PDF_DIR)/book.pdf

# The PDF built (make pdf), then read back by tests/test_book_pdf.py as make pdf-tests does: pages,
# chapter titles in order, figure captions, no raw MyST or TeX, links inside it. make test runs it
# beside the browser checks, so that the PDF's checks run while those finish.
pdf-check: $(STAMP) pdf
	$(call pytest_strict,tests/test_book_pdf.py -m pdf)

# The PDF read back (tests/test_book_pdf.py: pages, chapter titles in order, figure captions, no raw
# MyST or TeX, links inside it), as it is (make pdf-check builds it first).
pdf-tests: $(STAMP)
	$(call pytest_strict,tests/test_book_pdf.py -m pdf)

# The browser checks need Debian's Chromium (or $$CHROMIUM); a check that cannot start fails, it never
# skips. Where the browser is missing it is installed from Debian as root; otherwise this stops and
# prints the command. Checked first in `make test`, so a missing browser fails in seconds.
CHROMIUM_BIN ?= $(or $(CHROMIUM),/usr/bin/chromium)
chromium:
	@if [ -x "$(CHROMIUM_BIN)" ]; then exit 0; fi; \
	if [ "$$(id -u)" -eq 0 ] && command -v apt-get >/dev/null; then \
		echo "== installing Chromium from Debian for the browser checks"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; \
	fi; \
	if [ ! -x "$(CHROMIUM_BIN)" ]; then \
		echo "error: the browser checks need Chromium at $(CHROMIUM_BIN): run" >&2; \
		echo "  sudo apt-get install chromium   (or set CHROMIUM=/path/to/chromium)" >&2; \
		exit 1; \
	fi

# pytest exits with 5 when it collected nothing: that is a failure here, said plainly.
define pytest_strict
	$(BIN)/python -m pytest $(1) || { rc=$$?; \
		if [ $$rc -eq 5 ]; then echo "error: pytest collected no tests" >&2; fi; \
		exit $$rc; }
endef

# ---------------------------------------------------------------------------
# Re-execute every notebook in place, top to bottom in a fresh kernel, with book/
# as the working directory (as nbval and the book build do); then store the prose's {eval}
# results in each Markdown cell's metadata, which JupyterLab shows before anything runs
# (tools/myst_eval.py).
notebooks: $(STAMP)
	@test -n "$(NOTEBOOKS)" || { echo "error: no notebooks in book/" >&2; exit 1; }
	$(BIN)/jupyter nbconvert --to notebook --execute --inplace \
		--ExecutePreprocessor.kernel_name=python3 \
		--ExecutePreprocessor.timeout=180 \
		--ExecutePreprocessor.record_timing=False \
		$(NOTEBOOKS)
	$(BIN)/python tools/myst_eval.py $(NOTEBOOKS)

# JupyterLab from the venv: its "python3" kernel is the venv's Python, and the
# named kernel "kltutorial" points at the same interpreter. jupyterlab-myst (pinned in
# requirements.txt) renders the notebooks' MyST: math, admonitions, references, {eval} numbers.
# Extra options via LAB_ARGS, e.g. `make lab LAB_ARGS="--no-browser --port 8890"`.
LAB_ARGS ?=
LAB_ROOT := $(if $(filter 0,$(shell id -u)),--allow-root,)
lab: $(STAMP)
	$(BIN)/jupyter lab --ServerApp.root_dir=$(CURDIR)/book $(LAB_ROOT) $(LAB_ARGS)

clean:
	rm -rf $(BUILD) .pytest_cache .hypothesis .ruff_cache

# ---------------------------------------------------------------------------
# Mutation testing of the library against its own unit tests, for maintainers (not part of make test):
# mutmut (pinned here, installed into the venv by this target) edits one module at a time, monitoring,
# estimators, controllers, objective and logprobs, one small change per mutant, runs the module's own
# test files on each mutant and prints a table of mutants, killed, survived and score, then the
# survivors with their changed lines (tools/mutation.py; CONTRIBUTING.md, "Mutation testing", lists the
# known equivalent ones). About 13 minutes on 2 cores; MUTATION_ARGS picks modules and options, e.g.
# `make mutation MUTATION_ARGS="estimators --jobs 2"` or MUTATION_ARGS=logprobs.hidden.
MUTMUT_VERSION := 3.8.1
MUTATION_ARGS ?=
mutation: $(STAMP)
	$(BIN)/python -m pip install --quiet mutmut==$(MUTMUT_VERSION)
	$(BIN)/python tools/mutation.py $(MUTATION_ARGS)
