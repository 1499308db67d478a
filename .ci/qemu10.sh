#!/usr/bin/env bash
# Installs Debian's QEMU 10.x from bookworm-backports under a prefix
# (default /opt/qemu10) without touching the system's QEMU 7.2: the packages
# are downloaded, not installed, and unpacked with dpkg-deb. kosa8 runs it
# with KOSA8_QEMU=/opt/qemu10/usr/bin/qemu-system-x86_64 and finds its
# firmware under the same prefix (Debian's QEMU 10 is not relocatable, so
# kosa8 passes -L for the prefix's data folders itself).
#
# The libraries it links against are all in bookworm at the versions it
# needs; the script checks that (ldd) rather than trusting it. seabios comes
# from backports too: QEMU 10 depends on seabios >= 1.16.3, and microvm's
# default firmware (bios-microvm.bin) is SeaBIOS's in that QEMU.
set -euo pipefail
prefix="${1:-/opt/qemu10}"
export DEBIAN_FRONTEND=noninteractive
src=/etc/apt/sources.list.d/bookworm-backports.sources
if ! grep -rqs 'bookworm-backports' /etc/apt/sources.list /etc/apt/sources.list.d/; then
  cat >"$src" <<'EOS'
Types: deb
URIs: http://deb.debian.org/debian
Suites: bookworm-backports
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOS
fi
apt-get update -q
# Backports have priority 100: nothing installed is upgraded by this source.
pkgs=(qemu-system-x86 qemu-system-common qemu-system-data qemu-utils seabios)
dl="$(mktemp -d)"
trap 'rm -rf "$dl"' EXIT
# apt downloads as its own user (_apt) where it can write.
chown _apt "$dl" 2>/dev/null || chmod 777 "$dl"
(cd "$dl" && apt-get download -q -t bookworm-backports "${pkgs[@]}")
rm -rf "$prefix.new"
mkdir -p "$prefix.new"
for f in "$dl"/*.deb; do dpkg-deb -x "$f" "$prefix.new"; done
bin="$prefix.new/usr/bin/qemu-system-x86_64"
if ldd "$bin" | grep -q 'not found'; then
  ldd "$bin" | grep 'not found' >&2
  echo "qemu10: libraries missing for $bin" >&2
  exit 1
fi
"$bin" --version | head -1
rm -rf "$prefix"
mv "$prefix.new" "$prefix"
echo "qemu10: installed under $prefix; use KOSA8_QEMU=$prefix/usr/bin/qemu-system-x86_64"
