// Package debian is the host half of building the Debian guest image on a
// machine that has nothing of Debian's own tooling (no apt, dpkg, gpg or
// xz): a small Debian repository client that finds, resolves, downloads and
// unpacks binary packages in pure Go.
//
// # Trust chain
//
// The mirror and the network are untrusted; plain http is fine because
// integrity comes only from this chain, each link checked before the next is
// used:
//
//  1. The Debian archive signing keys are embedded in the binary (keys/*.asc),
//     so no key is ever taken from the network.
//  2. dists/SUITE/InRelease must carry at least one good OpenPGP signature
//     by one of those keys. Only the signed bytes are parsed: text around the
//     clearsigned block is rejected, and the Release fields come from the
//     verified plaintext. Its Codename or Suite must be the suite asked for
//     (a validly signed Release of another suite is a substitution), its
//     Valid-Until must not have passed, and its Date must not lie ahead.
//  3. The Release lists the size and SHA256 of every Packages file; a
//     Packages file is decompressed and parsed only after both match.
//  4. Each Packages stanza gives its .deb's size and SHA256; a download is
//     kept only if both match, and a cached .deb is reused only if its SHA256
//     still matches.
//
// What the chain cannot stop: a mirror may serve an older, still validly
// signed InRelease (a freeze or rollback). Debian's main suites carry no
// Valid-Until, so only the security suite bounds how old that can be.
//
// Every read of untrusted data is bounded (InRelease, Packages files
// compressed and decompressed, .deb downloads, deb822 lines and stanzas, ar
// members), so a hostile mirror can make a build fail but not exhaust the
// host.
package debian
