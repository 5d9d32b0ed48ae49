package main

import "os"

// getenv is the environment lookup; tests replace it. envDefaults is the
// only place the command reads the environment (ARCHITECTURE.md rule 10).
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
