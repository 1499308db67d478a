//go:build !linux

package main

import (
	"fmt"
	"os"
)

func main() {
	fmt.Fprintln(os.Stderr, "kosa8-agent runs inside a Linux guest only")
	os.Exit(2)
}
