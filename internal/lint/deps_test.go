package lint

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// toolOnly lists what a program that imports only the runtime (the root
// package and what it imports) must not build: the tools' packages and the
// libraries only they need (plotting, progress bars). The tools import the
// runtime, never the other way round; so do the models.
var toolOnly = []string{
	"gonum.org/v1/plot",
	"github.com/schollz/progressbar",
	"github.com/stablegraph/stablegraph/workload",
	"github.com/stablegraph/stablegraph/soak",
	"github.com/stablegraph/stablegraph/faultcampaign",
	"github.com/stablegraph/stablegraph/drivercost",
	"github.com/stablegraph/stablegraph/report",
	"github.com/stablegraph/stablegraph/models",
	"github.com/stablegraph/stablegraph/cmd",
}

// TestRuntimeBuildsNoTools runs `go list -deps` on the root package (what a
// library user's build compiles of this module) and fails when a tool or a
// tool's dependency is among them.
func TestRuntimeBuildsNoTools(t *testing.T) {
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command is needed to list the root package's dependencies: %v", err)
	}
	cmd := exec.Command(gobin, "list", "-deps", "-f", "{{.ImportPath}}", ".")
	cmd.Dir = "../.."
	out, err := cmd.Output()
	if err != nil {
		msg := ""
		if ee, ok := err.(*exec.ExitError); ok {
			msg = string(ee.Stderr)
		}
		t.Fatalf("go list -deps .: %v\n%s", err, msg)
	}
	deps := strings.Fields(string(out))
	if !slices.Contains(deps, "github.com/stablegraph/stablegraph/replay") {
		t.Fatalf("go list -deps . lists no replay among %d packages: the listing is broken", len(deps))
	}
	for _, d := range deps {
		for _, bad := range toolOnly {
			if d == bad || strings.HasPrefix(d, bad+"/") {
				t.Errorf("the root package's build includes %s (a tool's, under %s): a runtime-only program would compile it", d, bad)
			}
		}
	}
}
