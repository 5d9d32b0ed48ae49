package rendezvous

import (
	"errors"
	"io/fs"
	"strconv"
	"strings"
	"testing"
)

// envOf is a lookup over a map, for ParseLaunch.
func envOf(m map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) {
		v, ok := m[k]
		return v, ok
	}
}

// files is a readFile over a map.
func files(m map[string]string) func(string) ([]byte, error) {
	return func(name string) ([]byte, error) {
		if v, ok := m[name]; ok {
			return []byte(v), nil
		}
		return nil, &fs.PathError{Op: "open", Path: name, Err: fs.ErrNotExist}
	}
}

func TestParseLaunch(t *testing.T) {
	torchrun := map[string]string{"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4",
		"MASTER_ADDR": "node0", "MASTER_PORT": "29500", "TORCHELASTIC_RUN_ID": "none", "GROUP_RANK": "1"}
	srun := map[string]string{"SLURM_PROCID": "3", "SLURM_NTASKS": "4", "SLURM_LOCALID": "1", "SLURM_JOB_ID": "123456",
		"SLURM_STEP_NODELIST": "gpu[07-08]", "SLURM_JOB_NODELIST": "gpu[01-08]"}
	ompi := map[string]string{"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_LOCAL_RANK": "1",
		"OMPI_COMM_WORLD_LOCAL_SIZE": "2", "PMIX_NAMESPACE": "prterun-host-4242@1"}
	with := func(base map[string]string, kv ...string) map[string]string {
		m := map[string]string{}
		for k, v := range base {
			m[k] = v
		}
		for i := 0; i < len(kv); i += 2 {
			if kv[i+1] == "-" {
				delete(m, kv[i])
			} else {
				m[kv[i]] = kv[i+1]
			}
		}
		return m
	}
	for _, tc := range []struct {
		name string
		env  map[string]string
		want Launch // compared without AddrFrom and TokenFrom
		from string // a part of AddrFrom
	}{
		{"nothing", map[string]string{}, Launch{}, ""},
		{"torchrun", torchrun, Launch{Launcher: Torchrun, Rank: 5, World: 8, LocalRank: 1, Addr: "node0:29501"}, "MASTER_PORT+1"},
		{"torchrun-style by hand, no local rank", map[string]string{"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "1234"},
			Launch{Launcher: Torchrun, Rank: 1, World: 2, Addr: "10.0.0.1:1235"}, "MASTER_ADDR"},
		{"srun", srun, Launch{Launcher: Slurm, Rank: 3, World: 4, LocalRank: 1, Addr: "gpu07:23456"}, "SLURM_STEP_NODELIST"},
		{"srun without a step node list", with(srun, "SLURM_STEP_NODELIST", "-"), Launch{Launcher: Slurm, Rank: 3, World: 4, LocalRank: 1, Addr: "gpu01:23456"}, "SLURM_JOB_NODELIST"},
		{"srun, SLURM_NPROCS", with(srun, "SLURM_NTASKS", "-", "SLURM_NPROCS", "4"), Launch{Launcher: Slurm, Rank: 3, World: 4, LocalRank: 1, Addr: "gpu07:23456"}, ""},
		{"srun, MASTER_ADDR exported by the batch script", with(srun, "MASTER_ADDR", "gpu07", "MASTER_PORT", "29500"),
			Launch{Launcher: Slurm, Rank: 3, World: 4, LocalRank: 1, Addr: "gpu07:29501"}, "MASTER_PORT+1"},
		{"mpirun on one host", ompi, Launch{Launcher: MPIRun, Rank: 1, World: 2, LocalRank: 1, Addr: "127.0.0.1:" + strconv.Itoa(PortFor("prterun-host-4242@1"))}, "PMIX_NAMESPACE"},
		{"mpirun with MASTER_ADDR", with(ompi, "OMPI_COMM_WORLD_SIZE", "4", "MASTER_ADDR", "h0", "MASTER_PORT", "7000"),
			Launch{Launcher: MPIRun, Rank: 1, World: 4, LocalRank: 1, Addr: "h0:7001"}, ""},
		{"mpirun inside a SLURM allocation", with(ompi, "OMPI_COMM_WORLD_SIZE", "8", "OMPI_COMM_WORLD_RANK", "6",
			"SLURM_PROCID", "1", "SLURM_NTASKS", "2", "SLURM_JOB_ID", "77", "SLURM_JOB_NODELIST", "n[3-4]"),
			Launch{Launcher: MPIRun, Rank: 6, World: 8, LocalRank: 1, Addr: "n3:20077"}, "SLURM_JOB_NODELIST"},
		{"torchrun started by srun", with(torchrun, "SLURM_PROCID", "1", "SLURM_NTASKS", "2", "SLURM_JOB_ID", "9", "SLURM_JOB_NODELIST", "a,b"),
			Launch{Launcher: Torchrun, Rank: 5, World: 8, LocalRank: 1, Addr: "node0:29501"}, ""},
		{"torchrun started by mpirun", with(torchrun, "OMPI_COMM_WORLD_RANK", "1", "OMPI_COMM_WORLD_SIZE", "2"),
			Launch{Launcher: Torchrun, Rank: 5, World: 8, LocalRank: 1, Addr: "node0:29501"}, ""},
		{"RANK exported from SLURM's, agreeing", map[string]string{"RANK": "3", "WORLD_SIZE": "4", "SLURM_PROCID": "3", "SLURM_NTASKS": "4",
			"SLURM_LOCALID": "1", "SLURM_JOB_ID": "5", "SLURM_JOB_NODELIST": "x1"},
			Launch{Launcher: Torchrun, Rank: 3, World: 4, LocalRank: 1, Addr: "x1:20005"}, ""},
		{"a launcher chosen", with(srun, "RANK", "0", "WORLD_SIZE", "2", "STABLEGRAPH_LAUNCHER", "slurm"),
			Launch{Launcher: Slurm, Rank: 3, World: 4, LocalRank: 1, Addr: "gpu07:23456"}, ""},
		{"no launcher chosen", with(srun, "STABLEGRAPH_LAUNCHER", "none"), Launch{}, ""},
		{"STABLEGRAPH_RENDEZVOUS wins", with(torchrun, "STABLEGRAPH_RENDEZVOUS", "[fd00::1]:4000"),
			Launch{Launcher: Torchrun, Rank: 5, World: 8, LocalRank: 1, Addr: "[fd00::1]:4000"}, "STABLEGRAPH_RENDEZVOUS"},
		{"a world of one needs no address", map[string]string{"RANK": "0", "WORLD_SIZE": "1"}, Launch{Launcher: Torchrun, World: 1}, ""},
		{"empty values are unset", map[string]string{"RANK": "", "WORLD_SIZE": " "}, Launch{}, ""},
		{"the token", map[string]string{"STABLEGRAPH_TOKEN": "secret-secret-secret"}, Launch{Token: "secret-secret-secret"}, ""},
		{"the token file", map[string]string{"STABLEGRAPH_TOKEN_FILE": "/run/secrets/tok"}, Launch{Token: "from-a-file-0123456789"}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l, err := ParseLaunch(envOf(tc.env), files(map[string]string{"/run/secrets/tok": "  from-a-file-0123456789\n"}))
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(l.AddrFrom, tc.from) {
				t.Errorf("AddrFrom %q, want %q in it", l.AddrFrom, tc.from)
			}
			l.AddrFrom, l.TokenFrom = "", ""
			if l != tc.want {
				t.Fatalf("got  %+v\nwant %+v", l, tc.want)
			}
		})
	}
}

// TestParseLaunchErrors: partial and inconsistent environments are refused
// with an error naming the variables at fault.
func TestParseLaunchErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		env  map[string]string
		want string
	}{
		{"RANK alone", map[string]string{"RANK": "1"}, "RANK is set but WORLD_SIZE is not"},
		{"WORLD_SIZE alone", map[string]string{"WORLD_SIZE": "2"}, "WORLD_SIZE is set but RANK is not"},
		{"OMPI rank alone", map[string]string{"OMPI_COMM_WORLD_RANK": "1"}, "OMPI_COMM_WORLD_RANK is set but OMPI_COMM_WORLD_SIZE is not"},
		{"SLURM_PROCID alone", map[string]string{"SLURM_PROCID": "0"}, "SLURM_PROCID is set but SLURM_NTASKS is not"},
		{"rank = world", map[string]string{"RANK": "4", "WORLD_SIZE": "4"}, "RANK=4 is not below WORLD_SIZE=4"},
		{"SLURM rank = world", map[string]string{"SLURM_PROCID": "2", "SLURM_NTASKS": "2"}, "SLURM_PROCID=2 is not below SLURM_NTASKS=2"},
		{"world 0", map[string]string{"RANK": "0", "WORLD_SIZE": "0"}, "WORLD_SIZE=0"},
		{"not a number", map[string]string{"RANK": "one", "WORLD_SIZE": "2"}, `RANK="one" is not a non-negative integer`},
		{"negative", map[string]string{"RANK": "-1", "WORLD_SIZE": "2"}, `RANK="-1"`},
		{"local rank = local world", map[string]string{"RANK": "1", "WORLD_SIZE": "4", "LOCAL_RANK": "2", "LOCAL_WORLD_SIZE": "2",
			"MASTER_ADDR": "h", "MASTER_PORT": "1"}, "LOCAL_RANK=2 is not below LOCAL_WORLD_SIZE=2"},
		{"local world > world", map[string]string{"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_LOCAL_SIZE": "3"},
			"OMPI_COMM_WORLD_LOCAL_SIZE=3 is above OMPI_COMM_WORLD_SIZE=2"},
		{"torchrun-style and SLURM disagree", map[string]string{"RANK": "1", "WORLD_SIZE": "2", "SLURM_PROCID": "0", "SLURM_NTASKS": "2",
			"MASTER_ADDR": "h", "MASTER_PORT": "1"}, "disagree: RANK=1 WORLD_SIZE=2 (torchrun), but SLURM_PROCID=0 SLURM_NTASKS=2 (slurm)"},
		{"torchrun-style and mpirun disagree", map[string]string{"RANK": "1", "WORLD_SIZE": "2", "OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "4"},
			"set STABLEGRAPH_LAUNCHER"},
		{"local ranks disagree", map[string]string{"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "SLURM_PROCID": "1", "SLURM_NTASKS": "2",
			"SLURM_LOCALID": "1"}, "disagree"},
		{"a launcher chosen but absent", map[string]string{"STABLEGRAPH_LAUNCHER": "mpirun", "RANK": "0", "WORLD_SIZE": "1"},
			"STABLEGRAPH_LAUNCHER=mpirun, but mpirun's variables are not set"},
		{"an unknown launcher", map[string]string{"STABLEGRAPH_LAUNCHER": "pbs"}, `STABLEGRAPH_LAUNCHER="pbs"`},
		{"no address", map[string]string{"RANK": "1", "WORLD_SIZE": "2"}, "no address for rank 0: set STABLEGRAPH_RENDEZVOUS=host:port"},
		{"mpirun across hosts, no address", map[string]string{"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "4",
			"OMPI_COMM_WORLD_LOCAL_SIZE": "2", "PMIX_NAMESPACE": "x"}, "OMPI_COMM_WORLD_RANK=0 OMPI_COMM_WORLD_SIZE=4 (mpirun): no address"},
		{"MASTER_ADDR alone", map[string]string{"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "h"}, "MASTER_ADDR is set but MASTER_PORT is not"},
		{"MASTER_PORT alone", map[string]string{"RANK": "1", "WORLD_SIZE": "2", "MASTER_PORT": "5"}, "MASTER_PORT is set but MASTER_ADDR is not"},
		{"MASTER_PORT the last port", map[string]string{"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "65535"}, "MASTER_PORT=65535"},
		{"STABLEGRAPH_RENDEZVOUS without a port", map[string]string{"RANK": "1", "WORLD_SIZE": "2", "STABLEGRAPH_RENDEZVOUS": "node0"}, "STABLEGRAPH_RENDEZVOUS"},
		{"STABLEGRAPH_RENDEZVOUS without a host", map[string]string{"RANK": "1", "WORLD_SIZE": "2", "STABLEGRAPH_RENDEZVOUS": ":29500"}, "no host"},
		{"STABLEGRAPH_RENDEZVOUS port 0", map[string]string{"RANK": "1", "WORLD_SIZE": "2", "STABLEGRAPH_RENDEZVOUS": "h:0"}, "not a port number"},
		{"a bad node list", map[string]string{"SLURM_PROCID": "1", "SLURM_NTASKS": "2", "SLURM_JOB_ID": "1", "SLURM_STEP_NODELIST": "n[1-"}, "SLURM_STEP_NODELIST"},
		{"two token sources", map[string]string{"STABLEGRAPH_TOKEN": "a", "STABLEGRAPH_TOKEN_FILE": "/f"}, "both STABLEGRAPH_TOKEN and STABLEGRAPH_TOKEN_FILE"},
		{"a missing token file", map[string]string{"STABLEGRAPH_TOKEN_FILE": "/nope"}, "STABLEGRAPH_TOKEN_FILE: read the job token"},
		{"an empty token file", map[string]string{"STABLEGRAPH_TOKEN_FILE": "/empty"}, "/empty, which is empty"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l, err := ParseLaunch(envOf(tc.env), files(map[string]string{"/empty": " \n"}))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("ParseLaunch = %+v, %v; want an error with %q", l, err, tc.want)
			}
		})
	}
	_, err := ParseLaunch(envOf(map[string]string{"STABLEGRAPH_TOKEN_FILE": "/nope"}), files(nil))
	if !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("a missing token file: %v, want it to wrap fs.ErrNotExist", err)
	}
	_, err = ParseLaunch(envOf(map[string]string{"STABLEGRAPH_TOKEN_FILE": "/empty"}), files(map[string]string{"/empty": ""}))
	if !errors.Is(err, ErrNoToken) {
		t.Fatalf("an empty token file: %v, want ErrNoToken", err)
	}
}

func TestLaunchDeviceAndConfig(t *testing.T) {
	l := Launch{Launcher: Torchrun, Rank: 3, World: 4, LocalRank: 1, Addr: "node0:29501", Token: "t"}
	for _, tc := range []struct {
		count, want int
		err         string
	}{{1, 0, ""}, {2, 1, ""}, {8, 1, ""}} {
		if d, err := l.Device(tc.count); err != nil || d != tc.want {
			t.Errorf("Device(%d) = %d, %v; want %d", tc.count, d, err, tc.want)
		}
	}
	l.LocalRank = 2
	if _, err := l.Device(2); err == nil || !strings.Contains(err.Error(), "local rank 2 (torchrun) but only 2 devices") {
		t.Errorf("Device(2) with local rank 2: %v", err)
	}
	c := l.Config()
	if c.Addr != "node0:29501" || c.Listen != ":29501" || c.Rank != 3 || c.World != 4 || c.Token != "t" {
		t.Errorf("Config() = %+v", c)
	}
	for addr, want := range map[string]string{"localhost:7": "localhost:7", "127.0.0.1:7": "127.0.0.1:7", "[::1]:7": "[::1]:7",
		"node0:7": ":7", "10.1.2.3:7": ":7", "[fd00::1]:7": ":7", "garbage": "garbage"} {
		if got := ListenAddr(addr); got != want {
			t.Errorf("ListenAddr(%q) = %q, want %q", addr, got, want)
		}
	}
}

func TestFirstHost(t *testing.T) {
	for list, want := range map[string]string{"node01": "node01", "gpu[07-10,12],cpu3": "gpu07", "gpu[12,07-10]": "gpu12",
		"rack[1-2]-node[01-02]": "rack1-node01", "a,b[1-2]": "a", "n-1.cluster": "n-1.cluster"} {
		if got, err := FirstHost(list); err != nil || got != want {
			t.Errorf("FirstHost(%q) = %q, %v; want %q", list, got, err, want)
		}
	}
	for _, list := range []string{"", "x[1-", "x]", "x[a-b]", "x[[1]]", "[]", ",a"} {
		if got, err := FirstHost(list); err == nil {
			t.Errorf("FirstHost(%q) = %q, want an error", list, got)
		}
	}
}
