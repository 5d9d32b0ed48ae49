package main

import (
	"os"
	"strings"
)

// getenv is the environment lookup; tests replace it. envDefaults is the
// only place the command reads the environment (docs/ARCHITECTURE.md rule 10).
var getenv = os.Getenv

// envDefaults returns the defaults the environment sets for global flags.
// Flags given on the command line override them.
//
//	STABLEGRAPH_BACKEND  default for --backend (auto, sim, cuda)
func envDefaults() globalFlags {
	g := globalFlags{backend: "auto", devices: 1}
	if v := getenv("STABLEGRAPH_BACKEND"); v != "" {
		g.backend = v
	}
	return g
}

// ncclDefaults are the NCCL settings the rank processes of --nproc get
// unless the environment already sets them: graph-captured collectives
// register no buffers with their peers (required with VMM memory, the pool
// strategy's, before Blackwell; it also keeps capture local to each rank),
// and NVLink SHARP stays off (it needs multicast the project's machines do
// not lend).
var ncclDefaults = []string{"NCCL_GRAPH_REGISTER=0", "NCCL_NVLS_ENABLE=0"}

// childEnv is the environment of a rank process started by --nproc: this
// process's, plus ncclDefaults where unset.
func childEnv() []string {
	env := os.Environ()
	for _, kv := range ncclDefaults {
		name := kv[:strings.IndexByte(kv, '=')+1]
		set := false
		for _, e := range env {
			if strings.HasPrefix(e, name) {
				set = true
			}
		}
		if !set {
			env = append(env, kv)
		}
	}
	return env
}

// exitProcess ends the process (replaced in tests).
var exitProcess = os.Exit
