package wsync

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// hostWriteMethods are the Side methods that change a side.
var hostWriteMethods = []string{"Write", "Mkdir", "Symlink", "Remove"}

// rootWriteMethods are Root's methods that change the host folder.
var rootWriteMethods = []string{"WriteFile", "WriteFileLocked", "MkdirAll", "Symlink", "Remove", "RemoveLocked", "Chmod"}

// exprText renders a receiver expression as source ("e.host", "h.Root").
func exprText(x ast.Expr) string {
	switch x := x.(type) {
	case *ast.Ident:
		return x.Name
	case *ast.SelectorExpr:
		return exprText(x.X) + "." + x.Sel.Name
	case *ast.CallExpr:
		return exprText(x.Fun) + "()"
	case *ast.ParenExpr:
		return exprText(x.X)
	case *ast.StarExpr:
		return "*" + exprText(x.X)
	case *ast.TypeAssertExpr:
		return exprText(x.X) + ".(…)"
	}
	return "?"
}

// visitWithFunc walks f, telling fn the enclosing top-level function (its
// name, with the receiver type for a method: "HostSide.Write") and the
// node's parent.
func visitWithFunc(f *ast.File, fn func(fun string, n, parent ast.Node)) {
	for _, d := range f.Decls {
		fd, ok := d.(*ast.FuncDecl)
		name := ""
		if ok {
			name = fd.Name.Name
			if fd.Recv != nil && len(fd.Recv.List) == 1 {
				name = strings.TrimPrefix(exprText(fd.Recv.List[0].Type), "*") + "." + name
			}
		}
		var stack []ast.Node
		ast.Inspect(d, func(n ast.Node) bool {
			if n == nil {
				stack = stack[:len(stack)-1]
				return true
			}
			var parent ast.Node
			if len(stack) > 0 {
				parent = stack[len(stack)-1]
			}
			fn(name, n, parent)
			stack = append(stack, n)
			return true
		})
	}
}

func parseGoFiles(t *testing.T, dir string, recurse bool) map[string]*ast.File {
	t.Helper()
	fset := token.NewFileSet()
	out := map[string]*ast.File{}
	filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if p != dir && (!recurse || strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata") {
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
		out[p] = f
		return nil
	})
	return out
}

// The gate is the one way to the host folder (issue 9): in this package,
// the engine reaches the host Side outside Engine.gate only to scan and
// read it; only HostSide's own Write, Mkdir, Symlink and Remove call
// Root's writing methods; and no other package of the program calls them.
func TestOnlyTheGateWritesToTheHost(t *testing.T) {
	gateWrites := map[string]bool{}
	for p, f := range parseGoFiles(t, ".", false) {
		visitWithFunc(f, func(fun string, n, parent ast.Node) {
			sel, ok := n.(*ast.SelectorExpr)
			if !ok {
				return
			}
			// Rule 1: e.host outside the gate is only scanned or read.
			if sel.Sel.Name == "host" {
				if _, isIdent := sel.X.(*ast.Ident); isIdent && strings.HasPrefix(fun, "Engine.") {
					use := ""
					switch pn := parent.(type) {
					case *ast.SelectorExpr:
						use = pn.Sel.Name
					case *ast.TypeAssertExpr:
						use = "type assertion"
					}
					if fun == "Engine.gate" {
						if slices.Contains(hostWriteMethods, use) {
							gateWrites[use] = true
						}
					} else if use != "Scan" && use != "Read" && use != "type assertion" {
						t.Errorf("%s: %s uses %s (%q) outside the gate", p, fun, exprText(sel), use)
					}
				}
			}
			// Rule 2: Root's writing methods only from HostSide's.
			if slices.Contains(rootWriteMethods, sel.Sel.Name) {
				if _, isCall := parent.(*ast.CallExpr); !isCall {
					return
				}
				recv := exprText(sel.X)
				switch {
				case recv == "unix" || recv == "os" || recv == "e.guest" || recv == "e.host" || recv == "dst" || recv == "f":
					// not a Root (e.host: the gate, checked above)
				case recv == "h.Root" && filepath.Base(p) == "hostside.go" &&
					slices.Contains([]string{"HostSide.Write", "HostSide.Mkdir", "HostSide.Symlink", "HostSide.Remove"}, fun):
				default:
					t.Errorf("%s: %s calls %s.%s: host writes go through Engine.gate and HostSide", p, fun, recv, sel.Sel.Name)
				}
			}
		})
	}
	for _, m := range hostWriteMethods {
		if !gateWrites[m] {
			t.Errorf("the gate does not call the host's %s: has this test gone stale?", m)
		}
	}
	// Rule 3: the rest of the program holds a Root (or the host Side) only
	// to open, close and hand it to the engine. Read by the receiver's
	// name: a Root lives in fields and variables named root, a HostSide in
	// host.
	for p, f := range parseGoFiles(t, "../..", true) {
		if strings.Contains(filepath.ToSlash(p), "internal/wsync/") {
			continue
		}
		visitWithFunc(f, func(fun string, n, parent ast.Node) {
			sel, ok := n.(*ast.SelectorExpr)
			if !ok {
				return
			}
			recv := strings.ToLower(exprText(sel.X))
			if _, isCall := parent.(*ast.CallExpr); isCall && strings.Contains(recv, "root") &&
				(slices.Contains(rootWriteMethods, sel.Sel.Name) || slices.Contains(hostWriteMethods, sel.Sel.Name)) {
				t.Errorf("%s: %s calls %s.%s: host writes go through the sync engine's gate", p, fun, exprText(sel.X), sel.Sel.Name)
			}
			if _, isCall := parent.(*ast.CallExpr); isCall && strings.Contains(recv, "host") && slices.Contains(hostWriteMethods, sel.Sel.Name) {
				t.Errorf("%s: %s calls %s.%s: host writes go through the sync engine's gate", p, fun, exprText(sel.X), sel.Sel.Name)
			}
		})
	}
}
