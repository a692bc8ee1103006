# Shortcuts for the common developer commands (each is one line of the README's; the scripts set themselves up).
.PHONY: test test-fast test-all lint typecheck demo demo-full check check-connect bench

test:          ## the tests CI runs (sets up everything)
	sh tests/run.sh
test-fast:     ## lint, types, unit tests and one end-to-end test (< 5 minutes; for every change)
	sh tests/fast.sh
test-all:      ## every test, the slow ones too (the chaos suite's full run)
	sh tests/run.sh --runslow
lint:          ## ruff
	.venv/bin/ruff check capturer senders devtools tests bench
typecheck:     ## mypy
	.venv/bin/mypy
demo:          ## the demo, once, checked
	sh start.sh --demo --once
demo-full:     ## the demo with all four senders, once, checked
	sh start.sh --demo full --once
check:         ## refuse what a start of conf/config.cfg would refuse (connects to nothing)
	.venv/bin/python -m capturer --config conf/config.cfg --check
check-connect: ## ... and try every source and destination
	.venv/bin/python -m capturer --config conf/config.cfg --check --connect
bench:         ## the benchmarks (see docs/benchmarks.md)
	sh bench/run.sh
