package folder_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/kosa8/kosa8/internal/config"
	"github.com/kosa8/kosa8/internal/folder"
	"github.com/kosa8/kosa8/internal/project"
	"github.com/kosa8/kosa8/sdk"
)

// entryPoints are the places a host folder enters kosa8, each through the
// resolver (folder.Resolve or folder.Current, or sandbox.CheckWorkspace,
// which calls Resolve): "file: function" -> the face and what it reads.
// A new call of the resolver must be listed here, and a listed entry that
// no longer calls it fails too, so the list stays the inventory.
var entryPoints = map[string]string{
	"cmd/kosa8/lifecycle.go: projectConfig":             "CLI: the current folder, whose kosa8.toml create and run read",
	"cmd/kosa8/lifecycle.go: createFlags.sandboxConfig": "CLI: --workspace DIR, or the current folder, of create and run",
	"cmd/kosa8/setup.go: trustProject":                  "CLI: kosa8 trust [DIR] (the kosa8.toml trusted)",
	"cmd/kosa8/mcp.go: mcpRoots":                        "MCP: kosa8 mcp --folder, or the current folder",
	"cmd/kosa8/mcp.go: mcpServer.createOrPick":          "MCP: sandbox_create_or_pick's folder argument",
	"sdk/client.go: Client.config":                      "SDK: CreateOptions.Workspace (and the kosa8.toml read there)",
	"sdk/client.go: Client.ForFolder":                   "SDK: ForFolder's folder",
	"internal/sandbox/folder.go: CheckWorkspace":        "the workspace check every create goes through",
	"internal/sandbox/folder.go: HomeFolder":            "the home directory the checks refuse",
	"internal/supervisor/workspace.go: openWorkspace":   "API: a sandbox's recorded workspace, when its supervisor syncs it",
	"internal/access/access.go: Scope.workspaceInside":  "API: a sandbox's recorded workspace, when a caller's scope is checked",
	"internal/oci/pull.go: resolveSource":               "CLI and kosa8.toml: --image ./layout or ./image.tar, [image] from = a path",
	"cmd/kosa8/dockerbuild.go: dockerBuildFlags.run":    "CLI: kosa8 image build's CONTEXT (then walked through os.Root, no link followed)",
	"cmd/kosa8/oci.go: createFlags.devContainerBuild":   "CLI: a dev container's build.context and the project folder it must stay in",
}

// resolvers are the calls that make a folder.Path.
var resolvers = []string{"folder.Resolve", "folder.Current", "sandbox.CheckWorkspace"}

// pathReaders read a path as text or from the process (filepath.Abs and
// os.Getwd: their answer drops ".." before links, or keeps the shell's
// $PWD). Outside package folder they are allowed only here, each for a
// path that is not a folder given by anyone.
var pathReaders = map[string]map[string]string{
	"filepath.Abs": {
		"sdk/client.go: Client.Binary": "the kosa8 executable found on $PATH",
		"bench/main.go: setupHome":     "the benchmark's own -bin flag",
	},
	"filepath.EvalSymlinks": {
		"sdk/client.go: Client.Binary":          "the running executable",
		"internal/vmm/qemu/probecache.go: *":    "the QEMU binary",
		"internal/vmm/qemu/install.go: *":       "the QEMU binary",
		"internal/vmm/qemu/confine_linux.go: *": "the QEMU binary",
		"internal/launch/launch.go: *":          "the kosa8 binary",
		"internal/wsync/gitruns.go: *":          "where the links of git's files in an open workspace lead, to hold them: a check, never an open",
		"cmd/kosa8/setup.go: kosa8Command":      "the kosa8 on $PATH against the running one, for setup's hint",
	},
	"os.Getwd": {
		"cmd/kosa8/setup.go: setupCmd":              "to print this kosa8 relative to where the user is, in setup's hint",
		"cmd/kosa8/agents.go: agentFlags.recipeFor": "the key of a kept agent home (a name, never opened as a folder)",
	},
}

// Every place a folder enters kosa8 goes through the one resolver, and
// nothing else reads a path the ways that made issue 28's bugs.
func TestEveryFolderEntersThroughTheResolver(t *testing.T) {
	root := "../.."
	fset := token.NewFileSet()
	found := map[string]bool{}
	err := filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		rel = filepath.ToSlash(rel)
		if d.IsDir() {
			if (p != root && strings.HasPrefix(d.Name(), ".")) || d.Name() == "testdata" || rel == "internal/folder" || rel == "test" {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, p, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, decl := range f.Decls {
			fd, ok := decl.(*ast.FuncDecl)
			if !ok {
				continue
			}
			fun := fd.Name.Name
			if fd.Recv != nil && len(fd.Recv.List) == 1 {
				fun = recvName(fd.Recv.List[0].Type) + "." + fun
			}
			where := rel + ": " + fun
			ast.Inspect(fd, func(n ast.Node) bool {
				call, ok := n.(*ast.CallExpr)
				if !ok {
					return true
				}
				sel, ok := call.Fun.(*ast.SelectorExpr)
				if !ok {
					return true
				}
				pkg, ok := sel.X.(*ast.Ident)
				if !ok {
					return true
				}
				name := pkg.Name + "." + sel.Sel.Name
				if rel == "internal/sandbox/folder.go" && pkg.Name == "folder" {
					name = "folder." + sel.Sel.Name
				}
				if slices.Contains(resolvers, name) {
					found[where] = true
					if entryPoints[where] == "" {
						t.Errorf("%s calls %s: a new place a folder enters kosa8? list it in entryPoints (with its face)", where, name)
					}
				}
				if allowed, ok := pathReaders[name]; ok && allowed[where] == "" && allowed[rel+": *"] == "" {
					t.Errorf("%s calls %s: a folder given by anyone goes through folder.Resolve (links before \"..\"), never %s", where, name, name)
				}
				return true
			})
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	var stale []string
	for e := range entryPoints {
		if !found[e] {
			stale = append(stale, e)
		}
	}
	sort.Strings(stale)
	for _, e := range stale {
		t.Errorf("entry point %s no longer calls the resolver: has it moved? (update entryPoints)", e)
	}
}

// The types that carry a folder into the engine take a folder.Path, which
// only the resolver makes: a caller cannot hand them a string it read
// another way.
func TestFolderCarriersTakeAPath(t *testing.T) {
	pathType := reflect.TypeOf(folder.Path{})
	if f, ok := reflect.TypeOf(project.Options{}).FieldByName("Workspace"); !ok || f.Type != pathType {
		t.Errorf("project.Options.Workspace is %v, want folder.Path", f.Type)
	}
	if in := reflect.TypeOf(config.Load).In(0); in != pathType {
		t.Errorf("config.Load takes %v, want folder.Path", in)
	}
	// The SDK's fields that name a host folder: each is an entry point
	// above (a new one must be added there, and here).
	folderish := func(name string) bool {
		n := strings.ToLower(name)
		return strings.Contains(n, "workspace") || strings.Contains(n, "folder") || strings.HasSuffix(n, "dir") || strings.Contains(n, "path")
	}
	for _, ty := range []reflect.Type{reflect.TypeOf(sdk.CreateOptions{})} {
		for i := 0; i < ty.NumField(); i++ {
			if f := ty.Field(i); folderish(f.Name) && f.Name != "Workspace" {
				t.Errorf("sdk.%s.%s names a folder: read it through folder.Resolve and list its entry point", ty.Name(), f.Name)
			}
		}
	}
}

func recvName(x ast.Expr) string {
	switch x := x.(type) {
	case *ast.Ident:
		return x.Name
	case *ast.StarExpr:
		return recvName(x.X)
	case *ast.IndexExpr:
		return recvName(x.X)
	}
	return "?"
}
