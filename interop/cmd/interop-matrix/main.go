// interop-matrix runs tether against real Konnectivity peers on loopback and Unix sockets, and
// writes the results into COMPATIBILITY.md. interop/run.sh builds everything and runs it; see
// there for the inputs. Cells:
//
//  1. the Go konnectivity-client (two versions) -> tether server (gRPC over UDS)
//  2. kube-apiserver's egress selector dialer (two versions), three configurations -> tether
//  3. mixed pairs: upstream agent -> tether server and tether agent -> upstream server, with drain
//  4. upstream's integration suite with tether's agent (-agent-path)
//  5. the TLS key exchange group Go negotiates with tether in each direction (CurveID)
//
// Each cell that involves tether has a reference run of the same checks with upstream's own
// server and agent; error texts must match upstream's after ports and socket paths are removed.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"tether.dev/interop/internal/checks"
)

type peerBin struct {
	name     string // k8s-1.37, k8s-1.35
	path     string
	versions map[string]string
}

func (pb peerBin) client() string    { return "konnectivity-client " + pb.versions["konnectivity-client"] }
func (pb peerBin) apiserver() string { return "k8s.io/apiserver " + pb.versions["k8s.io/apiserver"] }

type env struct {
	ctx                       context.Context
	ps                        *procs
	work, pkiDir              string
	tetherServer, tetherAgent string
	upServer, upAgent         string
	upVersion                 string
	peers                     []peerBin
	echo, http, refused       string
	seq                       int
	cells                     []*cell
	suite                     []suiteResult
	topos                     map[topoKey]topo
}

func (e *env) pki(name string) string { return filepath.Join(e.pkiDir, name) }

func jsonUnmarshal(b []byte, v any) error {
	s := strings.TrimSpace(string(b))
	if i := strings.LastIndex(s, "\n"); i >= 0 {
		s = s[i+1:]
	}
	return json.Unmarshal([]byte(s), v)
}

func main() {
	var (
		binDir    = flag.String("bin", "", "interop/bin (upstream proxy-server, proxy-agent, gen-pki, test-target, k8s-*/konnectivity-peer)")
		tetherBin = flag.String("tether", "", "the tether binary")
		testBin   = flag.String("upstream-tests", "", "upstream's integration suite, compiled (go test -c)")
		testSrc   = flag.String("upstream-tests-src", "", "directory of upstream's tests/ source, to check the skip list against")
		upVersion = flag.String("upstream-version", "", "version of upstream's binaries and suite")
		out       = flag.String("out", "", "COMPATIBILITY.md to update (the generated block)")
		work      = flag.String("work", "", "scratch directory (sockets, PKI, logs)")
		only      = flag.String("only", "", "comma-separated sections to run (1,2,3,4,5,6); empty: all, and the file is written")
	)
	flag.Parse()
	if *binDir == "" || *tetherBin == "" || *work == "" || *upVersion == "" {
		fmt.Fprintln(os.Stderr, "interop-matrix: -bin, -tether, -work and -upstream-version are required")
		os.Exit(2)
	}
	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer cancel()

	e := &env{ctx: ctx, work: *work, upVersion: *upVersion,
		ps: &procs{logs: filepath.Join(*work, "logs")}, topos: map[topoKey]topo{}}
	code := 1
	func() {
		defer e.ps.stopAll()
		if err := e.setup(*binDir, *tetherBin); err != nil {
			fmt.Fprintln(os.Stderr, "interop-matrix: setup:", err)
			return
		}
		sections := map[string]bool{}
		for _, s := range strings.Split(*only, ",") {
			sections[strings.TrimSpace(s)] = *only != ""
		}
		run := func(n string) bool { return *only == "" || sections[n] }
		steps := []struct {
			n string
			f func() error
		}{
			{"1", e.section1}, {"2", e.section2}, {"3", e.section3},
			{"4", func() error { return e.section4(*testBin, *testSrc) }},
			{"5", e.section5}, {"6", e.section6},
		}
		for _, st := range steps {
			if !run(st.n) || ctx.Err() != nil {
				continue
			}
			fmt.Printf("\n== section %s\n", st.n)
			if err := st.f(); err != nil {
				fmt.Fprintf(os.Stderr, "interop-matrix: section %s: %v\n", st.n, err)
				e.cells = append(e.cells, &cell{section: st.n, peer: "(section setup)",
					checks: checks.List{{Name: "setup", Err: err}}})
			}
		}
		code = e.report(*out, *only == "")
	}()
	if ctx.Err() != nil {
		fmt.Fprintln(os.Stderr, "interop-matrix: interrupted")
		code = 130
	}
	os.Exit(code)
}

func (e *env) setup(binDir, tetherBin string) error {
	for _, d := range []string{"logs", "s", "tether-bin"} {
		if err := os.MkdirAll(filepath.Join(e.work, d), 0o755); err != nil {
			return err
		}
	}
	// tether under upstream's names: argv[0] selects `tether server` / `tether agent`.
	abs, err := filepath.Abs(tetherBin)
	if err != nil {
		return err
	}
	if st, err := os.Stat(abs); err != nil || st.Mode()&0o111 == 0 {
		return fmt.Errorf("tether binary %s: not an executable file (%v)", abs, err)
	}
	e.tetherServer = filepath.Join(e.work, "tether-bin", "proxy-server")
	e.tetherAgent = filepath.Join(e.work, "tether-bin", "proxy-agent")
	for _, l := range []string{e.tetherServer, e.tetherAgent} {
		if err := os.Symlink(abs, l); err != nil {
			return err
		}
	}
	e.upServer = filepath.Join(binDir, "proxy-server")
	e.upAgent = filepath.Join(binDir, "proxy-agent")
	for _, name := range []string{"k8s-1.37", "k8s-1.35"} {
		pb := peerBin{name: name, path: filepath.Join(binDir, name, "konnectivity-peer")}
		r, err := runTool(e.ctx, 10*time.Second, pb.path, "version")
		if err != nil {
			return err
		}
		if err := json.Unmarshal([]byte(r.raw), &pb.versions); err != nil {
			return err
		}
		e.peers = append(e.peers, pb)
	}
	e.pkiDir = filepath.Join(e.work, "pki")
	if out, err := exec.CommandContext(e.ctx, filepath.Join(binDir, "gen-pki"), "--dir", e.pkiDir).CombinedOutput(); err != nil {
		return fmt.Errorf("gen-pki: %v: %s", err, out)
	}
	echoPort, httpPort := freePort(), freePort()
	e.echo = fmt.Sprintf("127.0.0.1:%d", echoPort)
	e.http = fmt.Sprintf("127.0.0.1:%d", httpPort)
	e.refused = fmt.Sprintf("127.0.0.1:%d", freePort()) // nothing listens there
	if _, err := e.ps.start("test-target", filepath.Join(binDir, "test-target"), "--echo", e.echo, "--http", e.http); err != nil {
		return err
	}
	return waitStatus("http://"+e.http+"/", 200, 20*time.Second)
}

// ---- cells ----

type cell struct {
	section                                       string
	peer, version, frontend, transport, direction string
	checks                                        checks.List
	expected                                      string // an expected difference: why, and the evidence
	group                                         string // section 5: the negotiated key exchange group
}

func (e *env) newCell(section, peer, version, frontend, transport, direction string) *cell {
	c := &cell{section: section, peer: peer, version: version, frontend: frontend, transport: transport, direction: direction}
	e.cells = append(e.cells, c)
	fmt.Printf("-- %s | %s | %s/%s | %s\n", peer, version, frontend, transport, direction)
	return c
}

// run records one check: f returns a detail line (timings, texts) and an error on failure.
func (c *cell) run(name string, f func() (string, error)) { c.checks.Run(58, name, f) }

func (c *cell) failed() []string {
	var names []string
	for _, ch := range c.checks {
		if ch.Err != nil {
			names = append(names, ch.Name)
		}
	}
	return names
}

// expect turns a peerResult into a check outcome.
func expectOK(r peerResult, err error) (string, error) {
	if err != nil {
		return "", err
	}
	detail := ""
	if r.Bytes >= 1<<20 {
		detail = fmt.Sprintf("%.1f MiB/s", r.MiBPerSec)
	}
	if !r.OK {
		return detail, fmt.Errorf("%s", r)
	}
	return detail, nil
}

func mib(n int64) string { return fmt.Sprintf("%d", n<<20) }
