#!/usr/bin/env bash
# Runs a command with a PATH that holds QEMU and nothing else, as on a Mac:
# the guest image must build without mmdebstrap, debootstrap, apt, dpkg,
# mkfs, tar or a shell on PATH (issue 13). Checks first that none of them
# can be found.
set -euo pipefail
d=$(mktemp -d)
trap 'rm -rf "$d"' EXIT
for t in qemu-system-x86_64 qemu-system-aarch64 qemu-img; do
  if p=$(command -v "$t"); then ln -s "$p" "$d/$t"; fi
done
for t in mmdebstrap debootstrap apt apt-get dpkg dpkg-deb mkfs.ext4 mke2fs e2fsck resize2fs tar xz zstd gpg sh bash; do
  if PATH="$d" type -P "$t" >/dev/null; then
    echo "qemu-only: $t is still on the PATH" >&2
    exit 1
  fi
done
PATH="$d" "$@"
