package debian

import (
	"bytes"
	"embed"
	"fmt"
	"io/fs"
	"sync"

	"github.com/ProtonMail/go-crypto/openpgp"
)

// The Debian archive keys are compiled in so that the first link of the trust
// chain never comes from the network or from the host, which has no Debian
// keyring of its own.
//
//go:embed keys/*.asc
var keyFiles embed.FS

var debianKeys = sync.OnceValues(func() (openpgp.EntityList, error) {
	names, err := fs.Glob(keyFiles, "keys/*.asc")
	if err != nil {
		return nil, err
	}
	var all openpgp.EntityList
	for _, name := range names {
		data, err := keyFiles.ReadFile(name)
		if err != nil {
			return nil, err
		}
		el, err := openpgp.ReadArmoredKeyRing(bytes.NewReader(data))
		if err != nil {
			return nil, fmt.Errorf("embedded Debian key %s: %w", name, err)
		}
		all = append(all, el...)
	}
	if len(all) == 0 {
		return nil, fmt.Errorf("no embedded Debian archive keys")
	}
	return all, nil
})

// DebianKeyring returns the embedded Debian archive keys, the keyring Open
// uses when Options.Keyring is nil.
func DebianKeyring() (openpgp.EntityList, error) { return debianKeys() }
