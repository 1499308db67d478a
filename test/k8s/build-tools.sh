#!/bin/sh
# Builds, once, what `make test-k8s` runs beside kosa8: kube-apiserver from
# k8s.io/kubernetes, kine (SQLite) and agent-sandbox's controller and
# sandbox-router, all through the Go module proxy, into $KOSA8_K8S_CACHE
# (default ~/.cache/kosa8-k8s), never into the repository. At low priority:
# kube-apiserver took 1,965 s here (3 Dec 2026, the shared 2-core VM, nice 10).
set -e
K8S_VERSION=${K8S_VERSION:-v1.37.2}     # k8s.io/kubernetes
STAGING_VERSION=${STAGING_VERSION:-v0.37.2}
KINE_VERSION=${KINE_VERSION:-v0.17.5}
AGENT_SANDBOX_VERSION=${AGENT_SANDBOX_VERSION:-v1.0.1}
cache=${KOSA8_K8S_CACHE:-$HOME/.cache/kosa8-k8s}
bin=$cache/bin
mkdir -p "$bin" "$cache/apiserver" "$cache/tools"

build() { # dir out package
	start=$(date +%s)
	echo "building $3 (once; at nice 10)..."
	(cd "$1" && nice -n 10 go build -trimpath -ldflags=-s -o "$2" "$3")
	echo "$3 built in $(( $(date +%s) - start )) s" | tee -a "$cache/build-time.txt"
}

if [ ! -x "$bin/kube-apiserver" ]; then
	# k8s.io/kubernetes replaces its staging modules with folders of its
	# own, which `go install` refuses: a module of ours requires it and
	# names each staging module's release instead.
	cd "$cache/apiserver"
	GOFLAGS=-mod=mod go mod download -json "k8s.io/kubernetes@$K8S_VERSION" > /dev/null
	dir=$(go env GOMODCACHE)/k8s.io/kubernetes@$K8S_VERSION
	{
		printf 'module kosa8.local/apiserver\n\ngo 1.26.0\n\nrequire k8s.io/kubernetes %s\n\nreplace (\n' "$K8S_VERSION"
		grep -E '^\s*k8s.io/[a-z-]+ => ./staging' "$dir/go.mod" | awk -v v="$STAGING_VERSION" '{print "\t" $1 " => " $1 " " v}'
		printf ')\n'
	} > go.mod
	printf '//go:build tools\n\npackage tools\n\nimport _ "k8s.io/kubernetes/cmd/kube-apiserver"\n' > tools.go
	GOFLAGS=-mod=mod go mod tidy
	build "$cache/apiserver" "$bin/kube-apiserver" k8s.io/kubernetes/cmd/kube-apiserver
fi

cd "$cache/tools"
if [ ! -f go.mod ] || ! grep -q "agent-sandbox $AGENT_SANDBOX_VERSION" go.mod; then
	printf 'module kosa8.local/tools\n\ngo 1.26.0\n' > go.mod
	printf '//go:build tools\n\npackage tools\n\nimport (\n\t_ "github.com/k3s-io/kine"\n\t_ "sigs.k8s.io/agent-sandbox/cmd/agent-sandbox-controller"\n\t_ "sigs.k8s.io/agent-sandbox/sandbox-router/cmd"\n)\n' > tools.go
	GOFLAGS=-mod=mod go get "github.com/k3s-io/kine@$KINE_VERSION" "sigs.k8s.io/agent-sandbox@$AGENT_SANDBOX_VERSION"
	GOFLAGS=-mod=mod go mod tidy
fi
[ -x "$bin/kine" ] || build "$cache/tools" "$bin/kine" github.com/k3s-io/kine
[ -x "$bin/agent-sandbox-controller" ] || build "$cache/tools" "$bin/agent-sandbox-controller" sigs.k8s.io/agent-sandbox/cmd/agent-sandbox-controller
[ -x "$bin/sandbox-router" ] || build "$cache/tools" "$bin/sandbox-router" sigs.k8s.io/agent-sandbox/sandbox-router/cmd
