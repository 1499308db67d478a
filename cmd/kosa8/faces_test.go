package main

import (
	"context"
	"encoding/json"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// The CLI's and the MCP server's ways in for a host folder, enumerated
// from the commands and the tools themselves: each is listed here with
// where it goes, and a new flag, argument or tool property that names a
// folder or a path fails until it is (issue 28; the Go side is
// internal/folder's TestEveryFolderEntersThroughTheResolver).
var folderInputs = map[string]string{
	"kosa8 create --workspace":  "host folder: sandbox.CheckWorkspace (folder.Resolve)",
	"kosa8 run --workspace":     "host folder: sandbox.CheckWorkspace (folder.Resolve)",
	"kosa8 mcp --folder":        "host folder: mcpRoots (folder.Resolve)",
	"kosa8 trust DIR":           "host folder: trustProject (folder.Resolve)",
	"kosa8 exec --workdir":      "a path in the guest",
	"kosa8 run --workdir":       "a path in the guest",
	"kosa8 apply PATH":          "a path in the workspace, through wsync's gate (CleanRel)",
	"kosa8 approve PATH":        "a path in the workspace, through wsync's gate (CleanRel)",
	"kosa8 diff PATH":           "a path in the workspace, through wsync's gate (CleanRel)",
	"kosa8 serve --workspace":   "host folder (the pod's volume): sdk.Create's sandbox.CheckWorkspace (folder.Resolve)",
	"kosa8 serve --base-dir":    "a path in the guest (the contract's paths are under it: serve.contractPath)",
	"kosa8 serve --secrets-dir": "a host folder the operator mounts (a Kubernetes Secret), only read: serve.SecretsFromEnv",
	"kosa8 serve --token-file":  "a host file the operator mounts (a Kubernetes Secret), only read: serve.ReadToken",
	"kosa8 discard PATH":        "a path in the workspace, through wsync's gate (CleanRel)",
	"kosa8 image build --file":  "host file: the Dockerfile the user names, read bounded (its CONTEXT goes through folder.Resolve, then os.Root without links)",

	"mcp sandbox_create_or_pick.folder": "host folder: folder.Resolve, then the session's scope",
	"mcp read_file.path":                "a path in the guest",
	"mcp write_file.path":               "a path in the guest",
	"mcp list_dir.path":                 "a path in the guest",
	"mcp run.workdir":                   "a path in the guest",
}

var folderish = regexp.MustCompile(`(?i)dir|folder|workspace|path|file`)

func TestEveryFolderInputIsKnown(t *testing.T) {
	found := map[string]bool{}
	note := func(what string) {
		found[what] = true
		if folderInputs[what] == "" {
			t.Errorf("%s names a folder or path: say in folderInputs where it goes (a host folder goes through folder.Resolve)", what)
		}
	}
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		c.Flags().VisitAll(func(f *pflag.Flag) {
			if f.Value.Type() != "bool" && folderish.MatchString(f.Name) {
				note(c.CommandPath() + " --" + f.Name)
			}
		})
		for _, arg := range strings.Fields(c.Use)[1:] {
			arg = strings.Trim(arg, "[].")
			if arg == strings.ToUpper(arg) && folderish.MatchString(arg) {
				note(c.CommandPath() + " " + arg)
			}
		}
		for _, s := range c.Commands() {
			walk(s)
		}
	}
	walk(newRoot())

	cs, _ := mcpSession(t)
	list, err := cs.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, tool := range list.Tools {
		b, _ := json.Marshal(tool.InputSchema)
		var schema struct {
			Properties map[string]struct {
				Description string `json:"description"`
			} `json:"properties"`
		}
		json.Unmarshal(b, &schema)
		for name, p := range schema.Properties {
			if folderish.MatchString(name) || strings.Contains(p.Description, "user's machine") || strings.Contains(p.Description, "host") && strings.Contains(p.Description, "folder") {
				note("mcp " + tool.Name + "." + name)
			}
		}
	}
	var stale []string
	for k := range folderInputs {
		if !found[k] {
			stale = append(stale, k)
		}
	}
	sort.Strings(stale)
	for _, k := range stale {
		t.Errorf("%s is listed but no longer found: update folderInputs", k)
	}
}
