package main

import (
	"fmt"
	"io"
	"os"

	"github.com/kosa8/kosa8/internal/sandbox"
)

// noteKept tells the user, once 'kosa8 run' is done, that the sandbox it
// made under a name of kosa8's choosing is still there (each run without
// --rm leaves one), and how to use or remove it.
func noteKept(m *sandbox.Manager, sb *sandbox.Sandbox, named bool) {
	keptNote(os.Stderr, m, sb, named)
}

func keptNote(w io.Writer, m *sandbox.Manager, sb *sandbox.Sandbox, named bool) {
	if !named || sb.Config.Ephemeral {
		return // the user chose its name, or it goes by itself
	}
	name := sb.Config.Name
	if _, err := m.Open(name); err != nil {
		return
	}
	fmt.Fprintf(w, "kosa8: sandbox %s is kept, stopped: 'kosa8 start %s' runs it again, 'kosa8 rm %s' removes it ('kosa8 run --rm' removes it when the command ends)\n", name, name, name)
}
