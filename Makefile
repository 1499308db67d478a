# kosa8: make setup (build, install host packages, build the guest image), make test.
GO        ?= go
BIN       := bin
VERSION   ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)
# -trimpath and fixed flags keep kosa8-agent byte-identical across builds of
# the same source, so its initramfs is built once and reused.
GOFLAGS_  := -trimpath
LDFLAGS   := -s -w -X main.version=$(VERSION)

.PHONY: test-vm-arm64-all build setup setup-arm64 test unit test-vm test-vm-arm64 test-vm-qemu10 bench soak clean

# The guest agent for both guest architectures (kosa8 picks the one that
# matches the sandbox's --arch), and kosa8-agent for the host's own.
build:
	$(GO) build $(GOFLAGS_) -ldflags '$(LDFLAGS)' -o $(BIN)/kosa8 ./cmd/kosa8
	CGO_ENABLED=0 GOOS=linux $(GO) build $(GOFLAGS_) -ldflags '-s -w' -o $(BIN)/kosa8-agent ./cmd/kosa8-agent
	for a in amd64 arm64; do CGO_ENABLED=0 GOOS=linux GOARCH=$$a $(GO) build $(GOFLAGS_) -ldflags '-s -w' -o $(BIN)/kosa8-agent-linux-$$a ./cmd/kosa8-agent || exit 1; done

setup: build
	$(BIN)/kosa8 setup

# The arm64 guest image, for 'kosa8 run --arch arm64'. Built as the host's
# image is, in a builder VM, which on an x86-64 host runs under emulation
# (TCG), so 'setup' leaves it out.
setup-arm64: build
	$(BIN)/kosa8 setup --arch arm64

# The whole suite: unit tests, then the VM tests (needs 'make setup' first).
test: unit test-vm

# Unit tests: fast, no VM. The macOS (HVF) build is vetted too: no Mac here.
unit:
	$(GO) test ./...
	GOOS=darwin GOARCH=arm64 $(GO) vet ./...
	GOOS=linux GOARCH=arm64 $(GO) vet ./...
	cd python && python3 -m unittest discover -s tests

# VM tests: boot real sandboxes with the built image.
test-vm: build
	KOSA8_E2E=1 KOSA8_BIN=$(abspath $(BIN)) $(GO) test -count=1 -timeout 75m ./test/e2e/...

# The arm64 guest's VM tests (needs 'make setup-arm64' first; on an x86-64
# host they run under TCG and skip, saying why, without the image).
test-vm-arm64: build
	KOSA8_E2E=1 KOSA8_BIN=$(abspath $(BIN)) $(GO) test -count=1 -timeout 40m -run 'TestARM64' -v ./test/e2e/...

# The whole VM suite against arm64 guests (KOSA8_ARCH=arm64: every sandbox
# the tests make is an emulated arm64 one on an x86-64 host). Too slow for
# CI, which runs test-vm-arm64's subset; needs 'make setup-arm64' first.
test-vm-arm64-all: build
	KOSA8_ARCH=arm64 KOSA8_E2E=1 KOSA8_BIN=$(abspath $(BIN)) $(GO) test -count=1 -timeout 150m -v ./test/e2e/...

# The VM tests again under QEMU 10.x from Debian's bookworm-backports,
# unpacked under /opt/qemu10 by .ci/qemu10.sh beside the system's QEMU
# (CI runs both; the cross-version checkpoint test needs both). CI runs the
# subset below, the parts that touch QEMU's command line, migration and
# devices, so that both passes fit its time; QEMU10_TESTS=. runs them all.
QEMU10 ?= /opt/qemu10/usr/bin/qemu-system-x86_64
QEMU10_TESTS ?= TestBoot2GiB|TestRunShowsGuestKernelAndExitStatus|TestCheckpointAndRewind|TestStartFromCheckpoint|TestQEMUConfined|TestNewSandboxesStartFromATemplate
test-vm-qemu10: build
	@test -x $(QEMU10) || { echo "$(QEMU10) not found: run .ci/qemu10.sh (as root) first"; exit 1; }
	KOSA8_QEMU=$(QEMU10) KOSA8_E2E=1 KOSA8_BIN=$(abspath $(BIN)) $(GO) test -count=1 -timeout 30m -run '$(QEMU10_TESTS)' ./test/e2e/...

bench: build
	$(GO) run ./bench -bin $(abspath $(BIN)) boot
	$(GO) run ./bench -bin $(abspath $(BIN)) net
	$(GO) run ./bench -bin $(abspath $(BIN)) ws
	$(GO) run ./bench -bin $(abspath $(BIN)) cp
	$(GO) run ./bench -bin $(abspath $(BIN)) agents

# Not in CI: many sandboxes writing, deleting and fetching at once for
# 10 minutes, then files lost or corrupted and sandboxes stuck (both must
# be 0). SOAK="-sandboxes 6 -memory 384M -duration 10m" by default.
SOAK ?=
soak: build
	$(GO) run ./bench -bin $(abspath $(BIN)) $(SOAK) soak

clean:
	rm -rf $(BIN)
