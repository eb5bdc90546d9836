# notifyedge. `make help` lists the targets.
SHELL := /bin/bash
GO    ?= go
PKGS  := ./...

.DEFAULT_GOAL := help

## help: list the targets
help:
	@grep -E '^## ' $(MAKEFILE_LIST) | sed -e 's/^## //' | awk -F': ' '{ printf "  %-10s %s\n", $$1, $$2 }'

## deps: install what the tests need (PostgreSQL, redis-server, curl, promtool) when missing
deps: deps-postgres deps-redis deps-curl deps-promtool deps-chromium

# redis-server for the cache's integration tests. Debian's package would
# start a system server on 6379; policy-rc.d stops that during the install
# (the tests start their own on a free port).
deps-redis:
	@command -v redis-server >/dev/null 2>&1 && exit 0; \
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		echo "installing redis-server (apt-get install redis-server)"; \
		own=0; if [ ! -e /usr/sbin/policy-rc.d ]; then printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d && own=1; fi; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null; rc=$$?; \
		[ $$own = 1 ] && rm -f /usr/sbin/policy-rc.d; \
		[ $$rc = 0 ] || { echo "could not install redis-server: run 'sudo apt-get install redis-server'"; exit 1; }; \
	else echo "missing redis-server: run 'sudo apt-get install redis-server'"; exit 1; fi

# apt-install names a command and its Debian package: nothing when the
# command is there; else, as root with apt-get, the package is installed;
# else the command to run is printed and the target fails.
apt-install = command -v $(1) >/dev/null 2>&1 && exit 0; \
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		echo "installing $(2) (apt-get install $(2))"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(2) >/dev/null || \
		{ echo "could not install $(2): run 'sudo apt-get install $(2)'"; exit 1; }; \
	else echo "missing $(1): run 'sudo apt-get install $(2)'"; exit 1; fi

# curl runs the command edged -dev prints, in the dev-mode test.
deps-curl:
	@$(call apt-install,curl,curl)

# chromium runs the console's browser tests (headless, driven by chromedp).
deps-chromium:
	@$(call apt-install,chromium,chromium)

# promtool checks and unit-tests the alert rules in cmd/edged/ops. Debian
# ships it in the prometheus package, whose install would start a Prometheus
# server on :9090; policy-rc.d stops that during the install.
deps-promtool:
	@command -v promtool >/dev/null 2>&1 && exit 0; \
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		echo "installing promtool (apt-get install prometheus)"; \
		own=0; if [ ! -e /usr/sbin/policy-rc.d ]; then printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d && own=1; fi; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null; rc=$$?; \
		[ $$own = 1 ] && rm -f /usr/sbin/policy-rc.d; \
		[ $$rc = 0 ] || { echo "could not install promtool: run 'sudo apt-get install prometheus'"; exit 1; }; \
	else echo "missing promtool: run 'sudo apt-get install prometheus' (it ships promtool)"; exit 1; fi

# haproxy for make bench-scale only (not for make test). Debian's package
# would start a system haproxy; policy-rc.d stops that during the install.
deps-haproxy:
	@command -v haproxy >/dev/null 2>&1 && exit 0; \
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		echo "installing haproxy (apt-get install haproxy)"; \
		own=0; if [ ! -e /usr/sbin/policy-rc.d ]; then printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d && own=1; fi; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq haproxy >/dev/null; rc=$$?; \
		[ $$own = 1 ] && rm -f /usr/sbin/policy-rc.d; \
		[ $$rc = 0 ] || { echo "could not install haproxy: run 'sudo apt-get install haproxy'"; exit 1; }; \
	else echo "missing haproxy: run 'sudo apt-get install haproxy'"; exit 1; fi

# etcd, Patroni and haproxy for make bench-ha only (not for make test).
# Debian's packages would start system services; policy-rc.d stops that
# during the install, and the scenario starts its own on free ports.
deps-ha: deps-haproxy
	@command -v patroni >/dev/null 2>&1 && command -v etcd >/dev/null 2>&1 && exit 0; \
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		echo "installing patroni and etcd (apt-get install patroni etcd-server)"; \
		own=0; if [ ! -e /usr/sbin/policy-rc.d ]; then printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d && own=1; fi; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends patroni etcd-server >/dev/null; rc=$$?; \
		[ $$own = 1 ] && rm -f /usr/sbin/policy-rc.d; \
		[ $$rc = 0 ] || { echo "could not install patroni and etcd: run 'sudo apt-get install patroni etcd-server'"; exit 1; }; \
	else echo "missing patroni or etcd: run 'sudo apt-get install patroni etcd-server'"; exit 1; fi

# PostgreSQL server binaries: found like durable/pgtemp finds them.
# Installing Debian's package would create and start a "main" cluster; the
# tests start their own, so that is switched off before the install.
deps-postgres:
	@if command -v initdb >/dev/null 2>&1 || ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then exit 0; fi; \
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		echo "installing PostgreSQL server binaries (apt-get install postgresql)"; \
		mkdir -p /etc/postgresql-common && \
		{ [ -f /etc/postgresql-common/createcluster.conf ] || echo 'create_main_cluster = false' > /etc/postgresql-common/createcluster.conf; } && \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null || \
		{ echo "could not install PostgreSQL: run 'sudo apt-get install postgresql'"; exit 1; }; \
	else \
		echo "missing PostgreSQL server binaries (initdb, postgres): run 'sudo apt-get install postgresql'"; exit 1; \
	fi

## run: start edged -dev (throwaway Postgres, demo channel, prints a ready curl); needs only PostgreSQL's binaries
run: deps-postgres
	$(GO) build -o bin/ ./cmd/edged
	./bin/edged -dev

## build: build the binaries into bin/
build:
	$(GO) build -o bin/ ./cmd/...

## test: run the whole test suite (starts its own Postgres; what CI runs);
## durable's and edge's suites run again with one transaction per delivery
## (group commit off), so both modes give the same answers. Every run
## goes to the end even when one fails; a summary of what failed where
## closes it, and the exit status is non-zero if anything failed.
test: deps
	@logs=$$(mktemp -d); trap 'rm -rf "$$logs"' EXIT; rc=0; start=$$(date +%s); \
	echo "== go test ./... (group commit on, the default)"; \
	$(GO) test -count=1 -timeout 15m $(PKGS) 2>&1 | tee "$$logs/all"; [ $${PIPESTATUS[0]} = 0 ] || rc=1; \
	echo "== durable and edge again, group commit off (one transaction per delivery)"; \
	NOTIFYEDGE_TEST_GROUP_COMMIT=0 $(GO) test -count=1 -timeout 10m ./durable/ ./edge/ 2>&1 | tee "$$logs/single"; [ $${PIPESTATUS[0]} = 0 ] || rc=1; \
	echo; echo "== summary ($$(( $$(date +%s) - start )) s)"; \
	for run in all:"group commit on" single:"group commit off"; do \
		f="$$logs/$${run%%:*}"; \
		failed=$$(grep -E '^(--- FAIL|FAIL[[:space:]]|panic:)' "$$f" | sed 's/ ([0-9.]*s)$$//'); \
		if [ -n "$$failed" ]; then echo "$${run#*:}: FAILED"; echo "$$failed" | sed 's/^/    /'; \
		else echo "$${run#*:}: ok ($$(grep -cE '^ok[[:space:]]' "$$f") packages)"; fi; \
	done; exit $$rc

## test-race: the test suite under the race detector
test-race: deps
	$(GO) test -race -count=1 -timeout 20m $(PKGS)

## bench: every load scenario and ceiling on a fresh stack (vegeta; about 12 minutes, 7 of them the retention rows)
bench: deps
	$(GO) run ./cmd/edgebench run -out bench/results

## bench-compare: this tree against OLD=<commit>, runs taken in turn (SCENARIO=first RUNS=2): medians, ratios, CPU µs per request by process
SCENARIO ?= first
RUNS ?= 2
bench-compare: deps
	@test -n "$(OLD)" || { echo "set OLD=<commit> to compare against"; exit 1; }
	@dir=$$(mktemp -d); trap 'git worktree remove --force "$$dir/old" >/dev/null 2>&1; rm -rf "$$dir"' EXIT; \
	git worktree add --detach "$$dir/old" "$(OLD)" >/dev/null || exit 1; \
	(cd "$$dir/old" && $(GO) build -o "$$dir/edgebench-old" ./cmd/edgebench) || exit 1; \
	$(GO) build -o "$$dir/edgebench-new" ./cmd/edgebench || exit 1; \
	for i in $$(seq $(RUNS)); do for v in old new; do \
		echo "== $$v, run $$i of $(RUNS), load $$(cut -d' ' -f1-3 /proc/loadavg)"; \
		if [ $$v = old ]; then d="$$dir/old"; else d=.; fi; \
		(cd "$$d" && "$$dir/edgebench-$$v" run -scenario "$(SCENARIO)" -out "$$dir/$$v-$$i" >"$$dir/$$v-$$i.log" 2>&1) || \
			{ tail -20 "$$dir/$$v-$$i.log"; exit 1; }; \
	done; done; \
	"$$dir/edgebench-new" compare -old-label "$(OLD)" -new-label HEAD \
		-old "$$(ls "$$dir"/old-*/*.json | paste -sd,)" -new "$$(ls "$$dir"/new-*/*.json | paste -sd,)"

## bench-scale: three edged behind haproxy on a Redis Cluster and a Postgres
## with a synchronous standby; kills a node, a Redis master and the primary
bench-scale: deps deps-haproxy build
	$(GO) run ./cmd/edgebench scale -edged bin/edged -shipper bin/shipper

## bench-ha: three edged behind haproxy on Postgres managed by Patroni and etcd; a switchover, the leader killed, etcd's leader killed, the standby restarted; with synchronous_mode on, off, and on with the old readiness check (about 15 minutes)
bench-ha: deps deps-ha build
	$(GO) run ./cmd/edgebench ha -edged bin/edged

## bench-grown: first deliveries and hot duplicates on empty tables, then on a week of traffic (34.6M claims, 5M orders, 22.8M outbox rows, a day of cache entries), then retention deleting the day past it under load, in turns with none at first (about two hours)
bench-grown: deps
	$(GO) run ./cmd/edgebench run -scenario 'first,hotdup (cache on),grown' -out bench/results

## bench-soak: an hour at half the peak of first deliveries through edged, the shipper and the forwarder, retention deleting as fast as callbacks insert: latency and memory over time (DURATION=1h)
bench-soak: deps build
	$(GO) run ./cmd/edgebench soak -edged bin/edged -shipper bin/shipper -forwarder bin/forwarder -duration $(or $(DURATION),1h)

## bench-bloat: two weeks of claims and outbox rows turned over in minutes under retention and autovacuum, with the server's defaults and with a vacuum every 2 % of dead rows: the tables' sizes by day (about 20 minutes)
bench-bloat: deps
	$(GO) run ./cmd/edgebench bloat -out bench/results

## bench-bills: a daily statement of 100,000 and of 1,000,000 rows fetched, parsed and compared by edged: time and edged's peak memory
bench-bills: deps build
	$(GO) run ./cmd/edgebench bills -edged bin/edged -rows $(or $(ROWS),100000,1000000)

## bench-go: the Go benchmarks (durable beside raw pgx, the handler, the cache; fsync on)
bench-go: deps
	$(GO) test -run '^$$' -bench . -benchmem -benchtime 3s ./durable/... ./edge/

## demo: the incident replayed, naive design vs notifyedge (ORDERS=1000)
ORDERS ?= 1000
demo: deps
	$(GO) run ./cmd/edgebench demo -orders $(ORDERS)

## fuzz: fuzz every parser (channel adapters, admin routes, bills) for FUZZTIME each (default 60s)
FUZZTIME ?= 60s
fuzz:
	$(GO) test -run '^$$' -fuzz '^FuzzNotify$$' -fuzztime $(FUZZTIME) ./edge/channel/
	$(GO) test -run '^$$' -fuzz '^FuzzWeChat$$' -fuzztime $(FUZZTIME) ./edge/channel/
	$(GO) test -run '^$$' -fuzz '^FuzzAlipay$$' -fuzztime $(FUZZTIME) ./edge/channel/
	$(GO) test -run '^$$' -fuzz '^FuzzAdminRoute$$' -fuzztime $(FUZZTIME) ./edge/admin/
	$(GO) test -run '^$$' -fuzz '^FuzzWeChatBill$$' -fuzztime $(FUZZTIME) -fuzzminimizetime 10x ./edge/reconcile/bill/
	$(GO) test -run '^$$' -fuzz '^FuzzAlipayBill$$' -fuzztime $(FUZZTIME) -fuzzminimizetime 10x ./edge/reconcile/bill/
	$(GO) test -run '^$$' -fuzz '^FuzzAlipayZip$$' -fuzztime $(FUZZTIME) -fuzzminimizetime 10x ./edge/reconcile/bill/
	$(GO) test -run '^$$' -fuzz '^FuzzAdminBody$$' -fuzztime $(FUZZTIME) ./edge/admin/

## lint: gofmt, go vet, the import-direction check and no test code in any binary
lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt: $$out"; exit 1; fi
	$(GO) vet $(PKGS)
	@mod=$$($(GO) list -m); \
	for p in claimcache durable; do \
		[ -d $$p ] || continue; \
		bad=$$($(GO) list -deps ./$$p/... | grep "^$$mod/" | grep -vE "^$$mod/$$p(/|$$)" || true); \
		if [ -n "$$bad" ]; then echo "$$p must not import: $$bad"; exit 1; fi; \
	done; echo "imports: ok"
	@# No binary links test code: edged -dev's throwaway Postgres comes
	@# from durable/pgtemp and the benches' invariant checks from
	@# durable/invariant, never from durabletest.
	@for bin in $$($(GO) list ./cmd/...); do \
		deps=$$($(GO) list -deps $$bin) || exit 1; \
		if grep -qx testing <<<"$$deps"; then \
			echo "$$bin links package testing (a test helper reached a binary): see 'go list -deps $$bin'"; exit 1; \
		fi; \
	done; echo "binaries link no test code: ok"
	@# The channels' SDKs are for the cold path only (edge/reconcile/query,
	@# which edged links for reconciliation): the hot path links none.
	@for p in ./edge ./edge/channel ./edge/admin ./claimcache ./durable; do \
		deps=$$($(GO) list -deps $$p) || exit 1; \
		if grep -E 'wechatpay-apiv3|go-pay/gopay|smartwalle/alipay|standard-webhooks' <<<"$$deps"; then \
			echo "$$p links a channel SDK: only edge/reconcile/query may"; exit 1; \
		fi; \
	done; echo "the hot path links no channel SDK: ok"
	@deps=$$($(GO) list -deps ./cmd/edged) || exit 1; \
	if grep -E 'standard-webhooks' <<<"$$deps"; then \
		echo "cmd/edged links the Standard Webhooks SDK: it is for the cross-check tests only"; exit 1; \
	fi
	@# The forwarder reads the broker only: durable/outbox, not durable.
	@deps=$$($(GO) list -deps ./cmd/forwarder) || exit 1; \
	if grep -E '^github.com/jackc/pgx' <<<"$$deps" >/dev/null; then \
		echo "cmd/forwarder links a Postgres client: see 'go list -deps ./cmd/forwarder'"; exit 1; \
	fi; echo "forwarder links no Postgres client: ok"

.PHONY: help deps deps-postgres deps-redis deps-curl deps-promtool deps-chromium deps-haproxy deps-ha run build test demo bench-go bench-scale bench-ha bench-compare bench-grown bench-soak bench-bloat bench-bills fuzz test-race bench lint
