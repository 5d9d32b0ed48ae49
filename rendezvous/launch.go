package rendezvous

import (
	"errors"
	"fmt"
	"hash/fnv"
	"net"
	"strconv"
	"strings"
)

// Launchers: where a process started by torchrun, SLURM's srun, Open MPI's
// mpirun or by hand stands in its job, read from its environment in this one
// place. docs/MULTI-GPU.md gives the rules with an example per launcher.

// The environment variables of stablegraph itself.
const (
	// EnvToken holds the job token.
	EnvToken = "STABLEGRAPH_TOKEN"
	// EnvTokenFile names a file holding the job token (surrounding
	// whitespace is ignored). Set one of EnvToken and EnvTokenFile, not both.
	EnvTokenFile = "STABLEGRAPH_TOKEN_FILE"
	// EnvRendezvous is rank 0's host:port, used as is; it overrides the
	// address the launcher's variables give.
	EnvRendezvous = "STABLEGRAPH_RENDEZVOUS"
	// EnvLauncher names the launcher whose variables to read (torchrun,
	// slurm, mpirun), or none to read no launcher's, when variables of
	// several are set and disagree.
	EnvLauncher = "STABLEGRAPH_LAUNCHER"
)

// Launchers, as Launch.Launcher names them.
const (
	Torchrun = "torchrun" // RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT
	Slurm    = "slurm"    // SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID
	MPIRun   = "mpirun"   // OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE, OMPI_COMM_WORLD_LOCAL_RANK
)

// Launch is where this process stands in its job, as its launcher's
// environment says: its rank, the number of ranks, its rank on its host,
// rank 0's address and the job token.
type Launch struct {
	// Launcher is the launcher whose variables gave Rank and World, "" when
	// no launcher's variables are set (World is then 0).
	Launcher string
	// Rank is this process's rank, World the number of ranks, LocalRank
	// its rank among the ranks on this host (0 when the launcher does not
	// say), which picks its GPU (Device).
	Rank, World, LocalRank int
	// Addr is rank 0's host:port, "" when the environment gives none;
	// AddrFrom says which variables gave it.
	Addr, AddrFrom string
	// Token is the job token, "" when the environment has none; TokenFrom
	// says where it came from.
	Token, TokenFrom string
}

// Found reports whether a launcher's variables were set.
func (l Launch) Found() bool { return l.Launcher != "" }

func (l Launch) String() string {
	if !l.Found() {
		return "no launcher"
	}
	s := fmt.Sprintf("rank %d of %d (%s), local rank %d", l.Rank, l.World, l.Launcher, l.LocalRank)
	if l.Addr != "" {
		s += fmt.Sprintf(", rendezvous at %s (%s)", l.Addr, l.AddrFrom)
	}
	return s
}

// Config is the rendezvous configuration of l: rank 0 listens on every
// interface at Addr's port unless Addr's host is a loopback address (then
// on Addr only), since the name the other hosts resolve for rank 0's host
// need not be an address of that host as it resolves it (many systems map
// their own name to 127.0.1.1).
func (l Launch) Config() Config {
	return Config{Addr: l.Addr, Listen: ListenAddr(l.Addr), Rank: l.Rank, World: l.World, Token: l.Token}
}

// ListenAddr is where rank 0 listens to be reached at addr: addr itself
// when its host is a loopback address or localhost, else every interface at
// addr's port.
func ListenAddr(addr string) string {
	host, port, err := net.SplitHostPort(addr)
	if err != nil || isLoopback(host) {
		return addr
	}
	return net.JoinHostPort("", port)
}

func isLoopback(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// Device is the device this rank uses among count visible ones: its local
// rank, or device 0 when only one is visible (a launcher that binds one GPU
// to each process, as srun --gpus-per-task=1 or a Kubernetes pod does, makes
// it the only device the process sees).
func (l Launch) Device(count int) (int, error) {
	switch {
	case count == 1:
		return 0, nil
	case l.LocalRank < count:
		return l.LocalRank, nil
	}
	return 0, fmt.Errorf("rendezvous: local rank %d (%s) but only %d devices are visible: run at most %d ranks per host, or give each rank one device (CUDA_VISIBLE_DEVICES)",
		l.LocalRank, l.Launcher, count, count)
}

// ParseLaunch reads a launch from an environment: lookup is os.LookupEnv or
// a stand-in, readFile os.ReadFile or a stand-in (for EnvTokenFile). Errors
// name the variables at fault: a partial launcher environment (RANK without
// WORLD_SIZE), values out of range (a rank not below the world size),
// launchers that disagree, an address that cannot be made, two token
// sources. A world of more than one rank needs an address; the token is
// checked by Join.
//
// Which launcher: torchrun's variables when torchrun started this process
// (TORCHELASTIC_RUN_ID is set: it may itself run under srun or mpirun, whose
// variables then describe torchrun, not this process); else Open MPI's over
// SLURM's (mpirun inside a SLURM allocation leaves SLURM's variables of the
// allocation or of its own daemons); any others set must agree on the rank
// and world. EnvLauncher picks one explicitly.
//
// Rank 0's address, the first of: EnvRendezvous; MASTER_ADDR at port
// MASTER_PORT+1 (MASTER_PORT itself is torchrun's own store); in a SLURM job
// (SLURM_JOB_ID is set), the first host of SLURM_STEP_NODELIST (or
// SLURM_JOB_NODELIST), where SLURM places task 0, at port 20000 +
// SLURM_JOB_ID mod 10000; when every rank is on this host (Open
// MPI's OMPI_COMM_WORLD_LOCAL_SIZE or torchrun's LOCAL_WORLD_SIZE equals the
// world), 127.0.0.1 at port 20000 + a hash of the job's PMIx namespace
// (PMIX_NAMESPACE) mod 10000.
func ParseLaunch(lookup func(string) (string, bool), readFile func(string) ([]byte, error)) (Launch, error) {
	env := envReader{lookup}
	var l Launch
	var err error
	if l.Token, l.TokenFrom, err = env.token(readFile); err != nil {
		return Launch{}, err
	}
	v, err := env.launcher()
	if err != nil || v == nil {
		return l, err
	}
	l.Launcher, l.Rank, l.World, l.LocalRank = v.launcher, v.rank, v.world, v.local
	if l.Addr, l.AddrFrom, err = env.address(v); err != nil {
		return Launch{}, err
	}
	if l.Addr == "" && l.World > 1 {
		return Launch{}, fmt.Errorf("rendezvous: %s: no address for rank 0: set %s=host:port (rank 0's host, a free port), or MASTER_ADDR and MASTER_PORT (rank 0 listens at MASTER_PORT+1)",
			v, EnvRendezvous)
	}
	return l, nil
}

// envReader reads variables; an empty value counts as unset.
type envReader struct {
	lookup func(string) (string, bool)
}

func (e envReader) get(name string) (string, bool) {
	v, ok := e.lookup(name)
	v = strings.TrimSpace(v)
	return v, ok && v != ""
}

// int reads a non-negative integer variable.
func (e envReader) int(name string) (n int, set bool, err error) {
	v, set := e.get(name)
	if !set {
		return 0, false, nil
	}
	n, err = strconv.Atoi(v)
	if err != nil || n < 0 {
		return 0, true, fmt.Errorf("rendezvous: %s=%q is not a non-negative integer", name, v)
	}
	return n, true, nil
}

func (e envReader) token(readFile func(string) ([]byte, error)) (token, from string, err error) {
	tok, hasTok := e.get(EnvToken)
	path, hasFile := e.get(EnvTokenFile)
	switch {
	case hasTok && hasFile:
		return "", "", fmt.Errorf("rendezvous: both %s and %s are set: set one", EnvToken, EnvTokenFile)
	case hasTok:
		return tok, EnvToken, nil
	case !hasFile:
		return "", "", nil
	}
	b, err := readFile(path)
	if err != nil {
		return "", "", fmt.Errorf("rendezvous: %s: read the job token: %w", EnvTokenFile, err)
	}
	if tok = strings.TrimSpace(string(b)); tok == "" {
		return "", "", fmt.Errorf("%w: %s names %s, which is empty", ErrNoToken, EnvTokenFile, path)
	}
	return tok, fmt.Sprintf("%s (%s)", EnvTokenFile, path), nil
}

// view is one launcher's account of this process.
type view struct {
	launcher      string
	rankVar       string
	worldVar      string
	rank, world   int
	local         int
	localSet      bool
	localWorld    int  // 0: unknown
	torchrunChild bool // torchrun started this process
}

func (v *view) String() string {
	return fmt.Sprintf("%s=%d %s=%d (%s)", v.rankVar, v.rank, v.worldVar, v.world, v.launcher)
}

// view reads a launcher's variables: present when the rank's or the
// world's is set, and then both must be.
func (e envReader) view(launcher, rankVar string, worldVars []string, localVar, localWorldVar string) (*view, error) {
	v := &view{launcher: launcher, rankVar: rankVar, worldVar: worldVars[0]}
	rank, rankSet, err := e.int(rankVar)
	if err != nil {
		return nil, err
	}
	worldSet := false
	for _, name := range worldVars {
		var w int
		if w, worldSet, err = e.int(name); err != nil {
			return nil, err
		}
		if worldSet {
			v.world, v.worldVar = w, name
			break
		}
	}
	switch {
	case !rankSet && !worldSet:
		return nil, nil
	case !worldSet:
		return nil, fmt.Errorf("rendezvous: %s is set but %s is not (%s sets both): a partial %s environment", rankVar, worldVars[0], launcher, launcher)
	case !rankSet:
		return nil, fmt.Errorf("rendezvous: %s is set but %s is not (%s sets both): a partial %s environment", worldVars[0], rankVar, launcher, launcher)
	}
	v.rank = rank
	if v.local, v.localSet, err = e.int(localVar); err != nil {
		return nil, err
	}
	if localWorldVar != "" {
		if v.localWorld, _, err = e.int(localWorldVar); err != nil {
			return nil, err
		}
	}
	switch {
	case v.world == 0:
		return nil, fmt.Errorf("rendezvous: %s=0: a world needs a rank", v.worldVar)
	case v.rank >= v.world:
		return nil, fmt.Errorf("rendezvous: %s=%d is not below %s=%d", rankVar, v.rank, v.worldVar, v.world)
	case v.local >= v.world:
		return nil, fmt.Errorf("rendezvous: %s=%d is not below %s=%d", localVar, v.local, v.worldVar, v.world)
	case v.localWorld > v.world:
		return nil, fmt.Errorf("rendezvous: %s=%d is above %s=%d", localWorldVar, v.localWorld, v.worldVar, v.world)
	case v.localWorld > 0 && v.local >= v.localWorld:
		return nil, fmt.Errorf("rendezvous: %s=%d is not below %s=%d", localVar, v.local, localWorldVar, v.localWorld)
	}
	return v, nil
}

// launcher picks the launcher whose variables describe this process (see
// ParseLaunch); nil when none is set.
func (e envReader) launcher() (*view, error) {
	torch, err := e.view(Torchrun, "RANK", []string{"WORLD_SIZE"}, "LOCAL_RANK", "LOCAL_WORLD_SIZE")
	if err != nil {
		return nil, err
	}
	if torch != nil {
		_, torch.torchrunChild = e.get("TORCHELASTIC_RUN_ID")
	}
	ompi, err := e.view(MPIRun, "OMPI_COMM_WORLD_RANK", []string{"OMPI_COMM_WORLD_SIZE"}, "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE")
	if err != nil {
		return nil, err
	}
	slurm, err := e.view(Slurm, "SLURM_PROCID", []string{"SLURM_NTASKS", "SLURM_NPROCS"}, "SLURM_LOCALID", "")
	if err != nil {
		return nil, err
	}
	if name, ok := e.get(EnvLauncher); ok {
		for _, v := range []*view{torch, ompi, slurm} {
			if v != nil && v.launcher == name {
				return v, nil
			}
		}
		switch name {
		case "none":
			return nil, nil
		case Torchrun, MPIRun, Slurm:
			return nil, fmt.Errorf("rendezvous: %s=%s, but %s's variables are not set", EnvLauncher, name, name)
		}
		return nil, fmt.Errorf("rendezvous: %s=%q: want %s, %s, %s or none", EnvLauncher, name, Torchrun, Slurm, MPIRun)
	}
	if torch != nil && torch.torchrunChild {
		return torch, nil // torchrun is the innermost launcher
	}
	if ompi != nil {
		slurm = nil // mpirun's processes inherit the allocation's SLURM variables
	}
	var set []*view
	for _, v := range []*view{torch, ompi, slurm} {
		if v != nil {
			set = append(set, v)
		}
	}
	if len(set) == 0 {
		return nil, nil
	}
	chosen := set[0]
	for _, v := range set[1:] {
		if v.rank != chosen.rank || v.world != chosen.world || (v.localSet && chosen.localSet && v.local != chosen.local) {
			return nil, fmt.Errorf("rendezvous: the launchers' variables disagree: %v, but %v; unset the stale ones, or set %s to the launcher that started this process",
				chosen, v, EnvLauncher)
		}
		if !chosen.localSet && v.localSet {
			chosen.local, chosen.localSet = v.local, true
		}
	}
	return chosen, nil
}

// address finds rank 0's address (see ParseLaunch); "" when none applies.
func (e envReader) address(v *view) (addr, from string, err error) {
	if a, ok := e.get(EnvRendezvous); ok {
		if err := CheckAddr(a); err != nil {
			return "", "", fmt.Errorf("rendezvous: %s=%q: %w", EnvRendezvous, a, err)
		}
		return a, EnvRendezvous, nil
	}
	host, hasHost := e.get("MASTER_ADDR")
	port, hasPort, err := e.int("MASTER_PORT")
	if err != nil {
		return "", "", err
	}
	switch {
	case hasHost && hasPort:
		if port < 1 || port >= 65535 {
			return "", "", fmt.Errorf("rendezvous: MASTER_PORT=%d: rank 0 listens at MASTER_PORT+1, which must be a port (2 to 65535)", port)
		}
		return net.JoinHostPort(host, strconv.Itoa(port+1)), "MASTER_ADDR and MASTER_PORT+1", nil
	case hasHost:
		return "", "", errors.New("rendezvous: MASTER_ADDR is set but MASTER_PORT is not")
	case hasPort:
		return "", "", errors.New("rendezvous: MASTER_PORT is set but MASTER_ADDR is not")
	}
	job, hasJob, err := e.int("SLURM_JOB_ID")
	if err != nil {
		return "", "", err
	}
	for _, name := range []string{"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"} {
		list, ok := e.get(name)
		if !ok || !hasJob {
			continue
		}
		host, err := FirstHost(list)
		if err != nil {
			return "", "", fmt.Errorf("rendezvous: %s=%q: %w", name, list, err)
		}
		return net.JoinHostPort(host, strconv.Itoa(20000+job%10000)), fmt.Sprintf("the first host of %s, port 20000 + SLURM_JOB_ID mod 10000", name), nil
	}
	if v.localWorld == v.world {
		if ns, ok := e.get("PMIX_NAMESPACE"); ok {
			return net.JoinHostPort("127.0.0.1", strconv.Itoa(PortFor(ns))),
				"every rank on this host: 127.0.0.1, port 20000 + a hash of PMIX_NAMESPACE mod 10000", nil
		}
	}
	return "", "", nil
}

// PortFor is the port ParseLaunch derives from a PMIx namespace
// (PMIX_NAMESPACE) for a job whose ranks all run on one host.
func PortFor(namespace string) int {
	h := fnv.New32a()
	h.Write([]byte(namespace))
	return int(20000 + h.Sum32()%10000)
}

// CheckAddr checks that a is rank 0's address as the other ranks dial it:
// host:port, with a host and a port from 1 to 65535 (not 0, which would
// pick a port no other rank knows). EnvRendezvous, Config.Addr of the ranks
// other than 0 and the command line's --rendezvous are checked with it.
func CheckAddr(a string) error {
	host, port, err := net.SplitHostPort(a)
	if err != nil {
		return err
	}
	if host == "" {
		return errors.New("no host (rank 0's host name or address)")
	}
	if port == "" {
		return errors.New("no port (rank 0's port, 1 to 65535)")
	}
	if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 {
		return fmt.Errorf("port %q is not a port number (1 to 65535)", port)
	}
	return nil
}

// FirstHost is the first host of a SLURM host list ("gpu[07-10,12],cpu3"
// gives "gpu07"), where SLURM places task 0.
func FirstHost(list string) (string, error) {
	var b strings.Builder
	depth := 0
	for i := 0; i < len(list); i++ {
		c := list[i]
		switch {
		case c == ',' && depth == 0:
			i = len(list) // the first host ends here
			continue
		case c == '[':
			if depth > 0 {
				return "", errors.New("nested brackets")
			}
			depth++
			end := strings.IndexByte(list[i:], ']')
			if end < 0 {
				return "", errors.New("unbalanced brackets")
			}
			r := list[i+1 : i+end]
			r, _, _ = strings.Cut(r, ",")
			r, _, _ = strings.Cut(r, "-")
			if r == "" || strings.Trim(r, "0123456789") != "" {
				return "", fmt.Errorf("range %q is not numeric", list[i:i+end+1])
			}
			b.WriteString(r)
			i += end
			depth--
			continue
		case c == ']':
			return "", errors.New("unbalanced brackets")
		}
		b.WriteByte(c)
	}
	if b.Len() == 0 {
		return "", errors.New("no host")
	}
	return b.String(), nil
}
