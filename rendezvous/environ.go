package rendezvous

import "os"

// FromEnvironment is ParseLaunch of this process's environment. It is the
// library's one reader of the launchers' variables (internal/lint allows
// it); the command line reads them in cmd/stablegraph/env.go through
// ParseLaunch.
func FromEnvironment() (Launch, error) {
	return ParseLaunch(os.LookupEnv, os.ReadFile)
}
