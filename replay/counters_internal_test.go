package replay

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// TestCountersSubCoversEveryField: Sub is written field by field; a field
// it forgets would read as zero in every Stats.Last.
func TestCountersSubCoversEveryField(t *testing.T) {
	var c Counters
	v := reflect.ValueOf(&c).Elem()
	for i := range v.NumField() {
		v.Field(i).SetInt(int64(i + 1))
	}
	if got := c.Sub(Counters{}); got != c {
		t.Errorf("c - 0 = %+v, want %+v", got, c)
	}
	if got := c.Sub(c); got != (Counters{}) {
		t.Errorf("c - c = %+v, want zero", got)
	}
}

// TestRecordCountedInOnePlace: the counters of recordings and their
// causes, and the refusals by reason, are written by base.countRecord
// alone (base.go), so that no strategy counts a re-record without its
// cause; Fallbacks' own methods only combine counts already made. It
// reads this package's source.
func TestRecordCountedInOnePlace(t *testing.T) {
	counted := map[string]bool{"Records": true, "Rerecords": true, "MoveRerecords": true, "UpdateFallbacks": true,
		"RetryRerecords": true, "falls": true, "ByReason": true}
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	checked := 0
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		fset := token.NewFileSet()
		f, err := parser.ParseFile(fset, name, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			fn, ok := d.(*ast.FuncDecl)
			if !ok || fn.Body == nil || fn.Name.Name == "countRecord" || isFallbacksMethod(fn) {
				continue
			}
			checked++
			ast.Inspect(fn.Body, func(n ast.Node) bool {
				var lhs []ast.Expr
				switch s := n.(type) {
				case *ast.IncDecStmt:
					lhs = []ast.Expr{s.X}
				case *ast.AssignStmt:
					lhs = s.Lhs
				}
				for _, e := range lhs {
					for e != nil {
						switch x := e.(type) {
						case *ast.SelectorExpr:
							if counted[x.Sel.Name] {
								t.Errorf("%s: %s writes %s: only base.countRecord counts recordings and refusals",
									fset.Position(x.Pos()), fn.Name.Name, x.Sel.Name)
							}
							e = x.X
						case *ast.IndexExpr:
							e = x.X
						default:
							e = nil
						}
					}
				}
				return true
			})
		}
	}
	if checked < 50 {
		t.Fatalf("checked only %d functions: the walk is broken", checked)
	}
}

// isFallbacksMethod reports whether fn is a method of Fallbacks, whose
// arithmetic (clone, merge, since) builds maps of reasons.
func isFallbacksMethod(fn *ast.FuncDecl) bool {
	if fn.Recv == nil || len(fn.Recv.List) != 1 {
		return false
	}
	t := fn.Recv.List[0].Type
	if st, ok := t.(*ast.StarExpr); ok {
		t = st.X
	}
	id, ok := t.(*ast.Ident)
	return ok && id.Name == "Fallbacks"
}
