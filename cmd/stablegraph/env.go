package main

import (
	"fmt"
	"os"
	"strings"

	"github.com/stablegraph/stablegraph/rendezvous"
)

// The environment: envDefaults, launchEnv and childEnv are the only places
// the command reads it (docs/ARCHITECTURE.md rule 10). Tests replace the lookups.
var (
	getenv    = os.Getenv
	lookupEnv = os.LookupEnv
	readFile  = os.ReadFile
	environ   = os.Environ
)

// envDefaults returns the defaults the environment sets for global flags.
// Flags given on the command line override them.
//
//	STABLEGRAPH_BACKEND  default for --backend (auto, sim, cuda)
func envDefaults() globalFlags {
	g := globalFlags{backend: "auto", devices: 1}
	if v := getenv("STABLEGRAPH_BACKEND"); v != "" {
		g.backend, g.backendFrom = v, "STABLEGRAPH_BACKEND"
	}
	return g
}

// launchEnv reads where this process stands in a job started by a launcher
// (torchrun, srun, mpirun; rendezvous.ParseLaunch says how) and the job
// token (STABLEGRAPH_TOKEN or STABLEGRAPH_TOKEN_FILE). With ignoreLaunchers
// (the ranks were given on the command line) only the token is read.
func launchEnv(ignoreLaunchers bool) (rendezvous.Launch, error) {
	lookup := lookupEnv
	if ignoreLaunchers {
		lookup = func(k string) (string, bool) {
			if k == rendezvous.EnvLauncher {
				return "none", true
			}
			return lookupEnv(k)
		}
	}
	return rendezvous.ParseLaunch(lookup, readFile)
}

// readTokenFile reads the job token from the file --token-file names.
func readTokenFile(path string) (string, error) {
	b, err := readFile(path)
	if err != nil {
		return "", fmt.Errorf("--token-file: %w", err)
	}
	tok := strings.TrimSpace(string(b))
	if tok == "" {
		return "", fmt.Errorf("--token-file: %s is empty", path)
	}
	return tok, nil
}

// ncclDefaults are the NCCL settings the rank processes of --nproc get
// unless the environment already sets them: graph-captured collectives
// register no buffers with their peers (required with VMM memory, the pool
// strategy's, before Blackwell; it also keeps capture local to each rank),
// and NVLink SHARP stays off (it needs multicast the project's machines do
// not lend). docs/MULTI-GPU.md says when to change them.
var ncclDefaults = []string{"NCCL_GRAPH_REGISTER=0", "NCCL_NVLS_ENABLE=0"}

// childEnv is the environment of a rank process started by --nproc: this
// process's, plus ncclDefaults where unset, with the job token in
// STABLEGRAPH_TOKEN (an environment is readable by its owner only, a command
// line by every user of the host) in place of any token of this process's.
func childEnv(token string) []string {
	var env []string
	for _, kv := range environ() {
		if strings.HasPrefix(kv, rendezvous.EnvToken+"=") || strings.HasPrefix(kv, rendezvous.EnvTokenFile+"=") {
			continue
		}
		env = append(env, kv)
	}
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
	return append(env, rendezvous.EnvToken+"="+token)
}

// exitProcess ends the process (replaced in tests).
var exitProcess = os.Exit
