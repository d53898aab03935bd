# kubebridge: the two set-up commands are `make demo` and `make test`.
SHELL := bash
GO    ?= go
BIN   := bin

.PHONY: all build test test-unit test-example-consumer test-example-custom-bridge tools lint fuzz validate-examples docs demo chaos bench bench-micro clean

all: build

build: ## the bridge binary, into bin/
	$(GO) build -o $(BIN)/bridge ./cmd/bridge

tools: ## etcd, kube-apiserver, kube-controller-manager, kubectl, helm and alertmanager built from Go modules (cached; cold ~6 min)
	bash hack/tools/build.sh

# The longest packages first: go test starts packages in the order named
# (./... leaves out those named already), and test/e2e, the longest by far,
# would otherwise start after all the others (docs/benchmarks.md, CI time).
TEST_PKGS := ./test/e2e ./hack/bench ./...

test: tools ## everything: lint, unit and integration tests (real apiserver, etcd, NATS) with -race
	$(MAKE) lint
	$(MAKE) validate-examples
	$(GO) test -race -count=1 -timeout 30m -v $(TEST_PKGS)
	$(MAKE) test-example-consumer
	$(MAKE) test-example-custom-bridge

test-example-consumer: ## the consumer example, a module of its own (examples/consumer): vet, build and test it
	cd examples/consumer && $(GO) vet ./... && $(GO) build -o /dev/null . && $(GO) test -race -count=1 -v ./...

test-example-custom-bridge: ## a bridge of one's own with its own sink type (examples/custom-bridge, a module of its own): vet, build and test it; test/e2e's TestCustomBridge runs it against the apiserver
	cd examples/custom-bridge && $(GO) vet ./... && $(GO) build -o /dev/null . && $(GO) test -race -count=1 -v ./...

test-unit: ## only what needs no built tools (integration tests skip unless CI=true)
	$(GO) test -race -count=1 -timeout 30m -v ./...

lint: ## gofmt, go vet, and no tracked file over 1 MB (build outputs belong in .gitignore)
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	@big=$$(git ls-files -z | xargs -0 -r du -k 2>/dev/null | awk '$$1 > 1024 {print $$2" ("$$1" KiB)"}'); if [ -n "$$big" ]; then echo "tracked files over 1 MB (build outputs? add them to .gitignore):"; echo "$$big"; exit 1; fi
	$(GO) vet ./...

validate-examples: build ## every example in config/ must validate
	@for f in config/*.yaml; do ./$(BIN)/bridge validate --config $$f || exit 1; done

MODEL_OPS  ?= 250
MODEL_RUNS ?= 3
chaos: tools ## the fault-injection tests, longer: 20 SIGKILLs, a 60 s webhook outage, failover, apiserver and NATS restarts, the model test ($(MODEL_RUNS) seeds x $(MODEL_OPS) ops; KUBEBRIDGE_MODEL_SEED fixes the first)
	KUBEBRIDGE_CHAOS_KILLS=20 KUBEBRIDGE_TEST_OUTAGE=60s KUBEBRIDGE_MODEL_OPS=$(MODEL_OPS) KUBEBRIDGE_MODEL_RUNS=$(MODEL_RUNS) \
	  $(GO) test -race -count=1 -v -timeout 45m \
	  -run 'SIGKILL|Failover|NATSKV|DeleteWhileWatchBroken|WebhookOutage|NATSRestartUnderLoad|APIServerRestartUnderLoad|FlakyThenDownThenBack|RestartMidStream|Contract|Model' \
	  ./test/e2e ./pkg/sinks/...

BENCH_ARGS ?=
bench: tools ## end to end against a bare informer on the real apiserver: throughput, latency, CPU, RSS, memory (~20 min; docs/benchmarks.md); BENCH_ARGS adds phases: -cold 20000,100000 (cold start, warm restart), -slow 5ms,20ms,200ms,20ms>200ms,nats (slow sinks), -outage 10m (memory under churn while the sink is down), -cbor
	$(GO) run ./hack/bench $(BENCH_ARGS)

bench-micro: ## hot-path and pipeline microbenchmarks with allocations
	$(GO) test -run '^$$' -bench . -benchmem -count 6 ./internal/queue ./pkg/filters ./pkg/event ./pkg/informer

FUZZTIME ?= 30s
fuzz: ## run the config, subject, request-template, mirror key/value and watch-decoding fuzzers for FUZZTIME each
	$(GO) test ./pkg/config -run '^$$' -fuzz '^FuzzParse$$' -fuzztime $(FUZZTIME)
	$(GO) test ./pkg/fieldpath -run '^$$' -fuzz '^FuzzParse$$' -fuzztime $(FUZZTIME)
	$(GO) test ./pkg/sinks/nats -run '^$$' -fuzz '^FuzzSubject$$' -fuzztime $(FUZZTIME)
	$(GO) test ./internal/celsandbox -run '^$$' -fuzz '^FuzzJSONTemplateHoldsAnyString$$' -fuzztime $(FUZZTIME)
	$(GO) test ./pkg/sinks/webhook -run '^$$' -fuzz '^FuzzJoinPathStaysUnderTheBase$$' -fuzztime $(FUZZTIME)
	$(GO) test ./pkg/mirror -run '^$$' -fuzz '^FuzzKey$$' -fuzztime $(FUZZTIME)
	$(GO) test ./pkg/mirror -run '^$$' -fuzz '^FuzzParseKey$$' -fuzztime $(FUZZTIME)
	$(GO) test ./pkg/mirror -run '^$$' -fuzz '^FuzzDecode$$' -fuzztime $(FUZZTIME)
	$(GO) test ./internal/kubejson -run '^$$' -fuzz '^FuzzObject$$' -fuzztime $(FUZZTIME)
	$(GO) test ./internal/kubejson -run '^$$' -fuzz '^FuzzWatchStream$$' -fuzztime $(FUZZTIME)
	$(GO) test ./pkg/event -run '^$$' -fuzz '^FuzzAppendJSON$$' -fuzztime $(FUZZTIME)

docs: ## regenerate the config reference in README.md from pkg/config and the sink components
	$(GO) test ./pkg/components -run TestConfigReference -update

DEMO_ARGS ?=
demo: tools ## a local etcd + kube-apiserver, the bridge with config/demo.yaml and its embedded NATS, events tailed live
	$(GO) run ./hack/demo $(DEMO_ARGS)

clean:
	rm -rf $(BIN)
