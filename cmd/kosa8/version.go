package main

import (
	"fmt"
	"runtime"
	"runtime/debug"

	"github.com/spf13/cobra"
)

// release is kosa8's semantic version, raised by hand when a release is
// made (the commit it was built from is version, set at build time).
const release = "0.1.0"

// versionInfo is what 'kosa8 version' says.
type versionInfo struct {
	Version string `json:"version"` // semantic
	Commit  string `json:"commit"`  // git describe of the build, or "dev"
	Go      string `json:"go"`
	OS      string `json:"os"`
	Arch    string `json:"arch"`
}

func currentVersion() versionInfo {
	commit := version
	if commit == "dev" {
		// go build / go run: the module's VCS stamp, when there is one.
		if bi, ok := debug.ReadBuildInfo(); ok {
			for _, s := range bi.Settings {
				if s.Key == "vcs.revision" && len(s.Value) >= 7 {
					commit = s.Value[:7] + " (dev)"
				}
			}
		}
	}
	return versionInfo{Version: release, Commit: commit, Go: runtime.Version(), OS: runtime.GOOS, Arch: runtime.GOARCH}
}

func (v versionInfo) String() string {
	return fmt.Sprintf("%s (commit %s, %s, %s/%s)", v.Version, v.Commit, v.Go, v.OS, v.Arch)
}

func versionCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "version",
		Short: "Print kosa8's version (semantic, and the commit it was built from)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			v := currentVersion()
			if asJSON {
				return printJSON(v)
			}
			fmt.Println("kosa8 " + v.String())
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}
