package main

import (
	"fmt"
	"io"

	"github.com/kosa8/kosa8/internal/agent"
)

// adviseCredentials says what became of the credential files an agent
// wrote to its kept home (held: never kept). Where one of the preset's
// secrets is stored on this machine already, there is nothing to do, and
// it says so instead of asking for a 'kosa8 secret add' of a key kosa8
// holds; otherwise it gives the commands that store one.
func adviseCredentials(w io.Writer, p *agent.Preset, held []string, stored func(name string) bool) {
	if len(held) == 0 {
		return
	}
	var have string
	var missing []agent.Secret
	for _, s := range p.Secrets {
		if stored(s.Name) {
			if have == "" {
				have = s.Name
			}
		} else {
			missing = append(missing, s)
		}
	}
	for _, h := range held {
		if have != "" {
			fmt.Fprintf(w, "kosa8: %s wrote credentials to ~/%s; they are not kept, and need not be: %s is stored on this machine and goes in on the way out\n", p.Name, h, have)
			continue
		}
		fmt.Fprintf(w, "kosa8: %s wrote credentials to ~/%s; they are not kept. Store the key on this machine instead:\n", p.Name, h)
		for _, s := range missing {
			fmt.Fprintf(w, "    %s\n", s.AddCommand())
		}
	}
}

// secretStored reports whether the secret store holds name (a store that
// cannot be opened holds nothing, as far as advice goes).
func secretStored(name string) bool {
	st, err := openSecrets()
	if err != nil {
		return false
	}
	_, err = st.Describe(name)
	return err == nil
}
