# kosa8: make setup (build, install host packages, build the guest image), make test.
GO        ?= go
BIN       := bin
VERSION   ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)
# -trimpath and fixed flags keep kosa8-agent byte-identical across builds of
# the same source, so its initramfs is built once and reused.
GOFLAGS_  := -trimpath
LDFLAGS   := -s -w -X main.version=$(VERSION)

.PHONY: test-vm-images test-vm-arm64-all build install uninstall setup setup-arm64 test unit test-vm test-k8s test-vm-arm64 test-vm-qemu10 test-crash test-docker bench soak soak-kills clean

# The guest agent for both guest architectures (kosa8 picks the one that
# matches the sandbox's --arch), and kosa8-agent for the host's own.
build:
	$(GO) build $(GOFLAGS_) -ldflags '$(LDFLAGS)' -o $(BIN)/kosa8 ./cmd/kosa8
	CGO_ENABLED=0 GOOS=linux $(GO) build $(GOFLAGS_) -ldflags '-s -w' -o $(BIN)/kosa8-agent ./cmd/kosa8-agent
	for a in amd64 arm64; do CGO_ENABLED=0 GOOS=linux GOARCH=$$a $(GO) build $(GOFLAGS_) -ldflags '-s -w' -o $(BIN)/kosa8-agent-linux-$$a ./cmd/kosa8-agent || exit 1; done

# kosa8 into PREFIX/bin, the guest agents into PREFIX/lib/kosa8 (where kosa8
# looks for them beside ../lib/kosa8). PREFIX is /usr/local for root, else
# ~/.local; DESTDIR for packagers. Says so when PREFIX/bin is not on PATH.
PREFIX ?= $(if $(filter 0,$(shell id -u)),/usr/local,$(HOME)/.local)
AGENTS := kosa8-agent kosa8-agent-linux-amd64 kosa8-agent-linux-arm64
install: build
	install -d '$(DESTDIR)$(PREFIX)/bin' '$(DESTDIR)$(PREFIX)/lib/kosa8'
	install -m 0755 $(BIN)/kosa8 '$(DESTDIR)$(PREFIX)/bin/kosa8'
	for a in $(AGENTS); do install -m 0755 $(BIN)/$$a '$(DESTDIR)$(PREFIX)/lib/kosa8/'$$a || exit 1; done
	@case ":$$PATH:" in *':$(PREFIX)/bin:'*) echo 'installed: $(PREFIX)/bin/kosa8';; \
	  *) echo 'installed $(PREFIX)/bin/kosa8, which is not on your PATH: add  export PATH="$(PREFIX)/bin:$$PATH"  to your shell profile';; esac

uninstall:
	rm -f '$(DESTDIR)$(PREFIX)/bin/kosa8'
	for a in $(AGENTS); do rm -f '$(DESTDIR)$(PREFIX)/lib/kosa8/'$$a; done
	-rmdir '$(DESTDIR)$(PREFIX)/lib/kosa8' 2>/dev/null

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
QEMU10_TESTS ?= TestBoot2GiB|TestRunShowsGuestKernelAndExitStatus|TestCheckpointAndRewind|TestStartFromCheckpoint|TestQEMUConfined|TestNewSandboxesStartFromATemplate|TestForkIntoThree
test-vm-qemu10: build
	@test -x $(QEMU10) || { echo "$(QEMU10) not found: run .ci/qemu10.sh (as root) first"; exit 1; }
	KOSA8_QEMU=$(QEMU10) KOSA8_E2E=1 KOSA8_BIN=$(abspath $(BIN)) $(GO) test -count=1 -timeout 30m -run '$(QEMU10_TESTS)' ./test/e2e/...

# Not in CI (past the OCI image tests' budget): an OCI image named by
# kosa8.toml's [image] from with setup lines built over it, packages refused
# over an image without apt or apk, a dev container file's image (about
# 2.5 minutes under TCG); a Dockerfile built in a builder sandbox, run, pushed,
# and refused a host (1.5 minutes, plus the builder image's first build,
# 2-8 minutes by load); a Debian image made with the Dockerfile builder and
# [image] packages installed over it with apt (3.5-7.5 minutes; needs
# mmdebstrap). 6 min 39 s here at load 5 with the builder image built in the
# run; about 9 on a fresh cache (docs/testing.md).
test-vm-images: build
	KOSA8_E2E_LONG=1 KOSA8_E2E=1 KOSA8_BIN=$(abspath $(BIN)) $(GO) test -count=1 -timeout 60m -run 'TestOCIProjectImage|TestDockerfileBuild|TestDockerfileDebianPackages' -v ./test/e2e/...

# kosa8 under a real control plane (kube-apiserver over kine, agent-sandbox's
# CRDs, controller and router, deploy/kubernetes applied; the test plays the
# kubelet): see docs/kubernetes.md. The first run builds kube-apiserver and
# agent-sandbox into ~/.cache/kosa8-k8s (about 35 min here, once); a run
# after that takes about 3 min under TCG.
test-k8s: build
	sh test/k8s/build-tools.sh
	KOSA8_K8S=1 KOSA8_BIN=$(abspath $(BIN)) KOSA8_K8S_BIN=$${KOSA8_K8S_CACHE:-$$HOME/.cache/kosa8-k8s}/bin \
	KOSA8_AGENT_SANDBOX_DIR=$$($(GO) list -m -f '{{.Dir}}' sigs.k8s.io/agent-sandbox) \
	$(GO) test -count=1 -timeout 30m -v ./test/k8s/

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

# Not in CI: the same soak while a random sandbox's supervisor is killed
# (kill -9, QEMU with it) every minute and started again; at the end every
# file the users kept must be on the host byte for byte, and no file of
# the agents' corrupted (both 0). About 12 minutes.
soak-kills: build
	$(GO) run ./bench -bin $(abspath $(BIN)) -kill-every 1m $(SOAK) soak

# Not in CI (which tries 2): the crash tests with 10 kill points in a
# checkpoint and 10 in a rewind: under TCG about 3 minutes on a quiet machine, 12 on a loaded one.
test-crash: build
	KOSA8_CRASH_POINTS=10 KOSA8_E2E=1 KOSA8_BIN=$(abspath $(BIN)) $(GO) test -count=1 -timeout 40m -run 'TestCrash' -v ./test/e2e/...

# Containers inside (--docker): pull, run, compose, a Testcontainers-style
# flow, a build, a checkpoint and a rewind with the stack running, and
# privileged containers against the allow-list. Needs docker-registry
# (apt) on the host; builds the docker image on first use (2 min under
# TCG on a quiet 2-core machine, 7-10 loaded), then takes 4-11 min by load
# (6 min in all, build included, on a quiet one). Not in CI: under TCG
# every container start takes tens of seconds (docs/containers.md).
test-docker: build
	KOSA8_DOCKER_TESTS=1 KOSA8_E2E=1 KOSA8_BIN=$(abspath $(BIN)) $(GO) test -count=1 -timeout 60m -run 'TestDocker' -v ./test/e2e/...

clean:
	rm -rf $(BIN)
