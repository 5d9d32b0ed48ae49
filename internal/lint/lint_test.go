// Package lint holds tests that enforce stablegraph's house rules over the
// whole source tree, the way Pebble's internal/lint does: rules written as
// tests fail CI instead of living in a style guide nobody rereads.
package lint

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// getenvAllowed lists the files that may read the environment: options are
// read in one place per backend (docs/ARCHITECTURE.md rule 10).
var getenvAllowed = map[string]bool{
	"gpu/cuda/options.go":    true,
	"cmd/stablegraph/env.go": true,
	"rendezvous/environ.go":  true, // FromEnvironment: the launchers' variables
}

// panicAllowed lists the library files that may panic: registration of a
// nil or duplicate driver at init is a programming error, as in database/sql.
var panicAllowed = map[string]bool{
	"gpu/registry.go": true,
}

type goFile struct {
	rel  string
	file *ast.File
	fset *token.FileSet
}

// parsed is the tree, parsed once for every rule (the tests only read it).
var parsed struct {
	once  sync.Once
	files []goFile
	err   error
}

// sourceFiles returns every Go file of the module, parsed.
func sourceFiles(t *testing.T) []goFile {
	t.Helper()
	parsed.once.Do(func() { parsed.files, parsed.err = parseTree() })
	if parsed.err != nil {
		t.Fatal(parsed.err)
	}
	return parsed.files
}

func parseTree() ([]goFile, error) {
	root, err := filepath.Abs("../..")
	if err != nil {
		return nil, err
	}
	var files []goFile
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			name := d.Name()
			if path != root && (strings.HasPrefix(name, ".") || name == "testdata" || name == "vendor") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") {
			return nil
		}
		rel, _ := filepath.Rel(root, path)
		fset := token.NewFileSet()
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution|parser.ParseComments)
		if err != nil {
			return err
		}
		files = append(files, goFile{rel: filepath.ToSlash(rel), file: f, fset: fset})
		return nil
	})
	if err != nil {
		return nil, err
	}
	if len(files) < 5 {
		return nil, fmt.Errorf("found only %d Go files under %s: the walk is broken", len(files), root)
	}
	return files, nil
}

func isTest(rel string) bool {
	return strings.HasSuffix(rel, "_test.go") || strings.Contains(rel, "/gputest/") ||
		strings.HasPrefix(rel, "internal/lint/")
}

// callName returns "pkg.Func" for a selector call and "func" for a plain one.
func callName(c *ast.CallExpr) string {
	switch fn := c.Fun.(type) {
	case *ast.SelectorExpr:
		if id, ok := fn.X.(*ast.Ident); ok {
			return id.Name + "." + fn.Sel.Name
		}
	case *ast.Ident:
		return fn.Name
	}
	return ""
}

// imports reports whether f imports path, and under which local name.
func imports(f *ast.File, path string) (string, bool) {
	for _, imp := range f.Imports {
		p, _ := strconv.Unquote(imp.Path.Value)
		if p == path {
			if imp.Name != nil {
				return imp.Name.Name, true
			}
			return filepath.Base(path), true
		}
	}
	return "", false
}

func TestNoScatteredGetenv(t *testing.T) {
	for _, gf := range sourceFiles(t) {
		name, ok := imports(gf.file, "os")
		if !ok || isTest(gf.rel) || getenvAllowed[gf.rel] {
			continue
		}
		ast.Inspect(gf.file, func(n ast.Node) bool {
			if c, ok := n.(*ast.CallExpr); ok {
				switch callName(c) {
				case name + ".Getenv", name + ".LookupEnv", name + ".Environ":
					t.Errorf("%s: %s reads the environment; read options in one place (see getenvAllowed)",
						gf.fset.Position(c.Pos()), callName(c))
				}
			}
			return true
		})
	}
}

func TestNoPanicInLibraryCode(t *testing.T) {
	for _, gf := range sourceFiles(t) {
		if isTest(gf.rel) || panicAllowed[gf.rel] || gf.file.Name.Name == "main" {
			continue
		}
		ast.Inspect(gf.file, func(n ast.Node) bool {
			if c, ok := n.(*ast.CallExpr); ok && callName(c) == "panic" {
				t.Errorf("%s: panic in library code; return an error", gf.fset.Position(c.Pos()))
			}
			return true
		})
	}
}

// figureAllowed lists the files whose comments may give a time in µs:
// documented defaults and rules of the code's own, not measurements.
var figureAllowed = map[string]string{
	"options.go":     "vmm's polling defaults",
	"replay/auto.go": "auto's tie rule (probeTieUS)",
	"vmm/wait.go":    "WaitPolicy's defaults",
	"gpu/sim/doc.go": "the sim's polling interval",
	"report/plot.go": "an example of a chart label",
}

// usFigure is a time in microseconds: "4.4 µs", "1.3–1.9 µs".
var usFigure = regexp.MustCompile(`[0-9] ?µs\b`)

// TestNoMeasuredFiguresInComments: production comments cite no results
// folder and no measured time; measurements go stale, so they live in
// BENCHMARKS.md and docs/GPU-MACHINE.md, and a comment says why, pointing
// there for how much.
func TestNoMeasuredFiguresInComments(t *testing.T) {
	for _, gf := range sourceFiles(t) {
		if isTest(gf.rel) {
			continue
		}
		for _, cg := range gf.file.Comments {
			for _, c := range cg.List {
				pos := gf.fset.Position(c.Pos())
				if strings.Contains(c.Text, "bench/results") {
					t.Errorf("%s: a comment cites a results folder; cite BENCHMARKS.md instead", pos)
				}
				if _, ok := figureAllowed[gf.rel]; !ok && usFigure.MatchString(c.Text) {
					t.Errorf("%s: a comment gives a time in µs (%q); measurements go in BENCHMARKS.md or docs/GPU-MACHINE.md",
						pos, usFigure.FindString(c.Text))
				}
			}
		}
	}
}

// TestPackagesHaveDocs checks that every non-main package has a package doc
// comment saying what it is for.
func TestPackagesHaveDocs(t *testing.T) {
	documented := map[string]bool{}
	dirs := map[string]bool{}
	for _, gf := range sourceFiles(t) {
		if strings.HasSuffix(gf.rel, "_test.go") {
			continue
		}
		dir := filepath.Dir(gf.rel)
		dirs[dir] = true
		if gf.file.Doc != nil && len(strings.TrimSpace(gf.file.Doc.Text())) > 20 {
			documented[dir] = true
		}
	}
	for dir := range dirs {
		if !documented[dir] {
			t.Errorf("package in %s has no package doc comment", dir)
		}
	}
	if _, err := os.Stat("../../go.mod"); err != nil {
		t.Fatal("lint must run from internal/lint inside the module")
	}
}

// writeAllowed lists the files that may create or write files directly:
// the rest go through internal/atomicfile, so that a file is written whole
// or not at all and a failed write never removes what was there.
var writeAllowed = map[string]bool{
	"internal/atomicfile/atomicfile.go": true,
}

func TestFilesWrittenWhole(t *testing.T) {
	for _, gf := range sourceFiles(t) {
		name, ok := imports(gf.file, "os")
		if !ok || isTest(gf.rel) || writeAllowed[gf.rel] {
			continue
		}
		ast.Inspect(gf.file, func(n ast.Node) bool {
			if c, ok := n.(*ast.CallExpr); ok {
				switch callName(c) {
				case name + ".Create", name + ".WriteFile", name + ".CreateTemp", name + ".OpenFile":
					t.Errorf("%s: %s writes a file in place; use internal/atomicfile (see writeAllowed)",
						gf.fset.Position(c.Pos()), callName(c))
				}
			}
			return true
		})
	}
}
