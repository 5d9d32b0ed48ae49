package cu

import "testing"

func TestNCCLCandidates(t *testing.T) {
	if got := NCCLCandidates("/opt/x/libnccl.so.2"); len(got) != 1 || got[0] != "/opt/x/libnccl.so.2" {
		t.Errorf("NCCLCandidates(explicit) = %v, want only the explicit file", got)
	}
	got := NCCLCandidates("")
	if got[0] != "libnccl.so.2" {
		t.Errorf("first candidate %q, want the loader's libnccl.so.2", got[0])
	}
	if !contains(got, "/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib/libnccl.so.2") {
		t.Errorf("NCCLCandidates lacks the GPU machine's NCCL")
	}
}

func TestOpenNCCLMissing(t *testing.T) {
	const path = "/nonexistent/stablegraph-test/libnccl.so.2"
	_, err := OpenNCCL(path)
	le, ok := err.(*LoadError)
	if !ok || le.Library != "libnccl" || len(le.Tried) != 1 || le.Tried[0].Path != path {
		t.Fatalf("OpenNCCL(missing) = %v, want a LoadError naming %s", err, path)
	}
}

func TestNCCLResultNames(t *testing.T) {
	for r, want := range map[NCCLResult]string{NCCLSuccess: "ncclSuccess", NCCLRemoteError: "ncclRemoteError",
		NCCLInProgress: "ncclInProgress", NCCLResult(42): "ncclResult_t(42)"} {
		if got := r.Name(); got != want {
			t.Errorf("%d.Name() = %q, want %q", int(r), got, want)
		}
	}
}
