package main

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

const (
	tether   = "tether"
	upstream = "upstream"
)

// server is one proxy server, tether's or upstream's, started with the same upstream flags.
type server struct {
	kind, mode, transport string // mode grpc | http-connect; transport uds | tcp
	name                  string
	uds                   string // transport uds
	front                 string // transport tcp: 127.0.0.1:port (mTLS)
	agentPort             int
	health, admin         int
	p                     *proc
	egressConfig          string // http-connect, or grpc over uds: an EgressSelectorConfiguration for it
}

type agent struct {
	kind, name    string
	health, admin int
	p             *proc
}

func (s *server) metricsURL() string { return fmt.Sprintf("http://127.0.0.1:%d/metrics", s.health) }
func (a *agent) metricsURL() string  { return fmt.Sprintf("http://127.0.0.1:%d/metrics", a.health) }

func (s *server) label() string { return s.mode + "/" + s.transport }

func (e *env) serverBin(kind string) string {
	if kind == tether {
		return e.tetherServer
	}
	return e.upServer
}

func (e *env) agentBin(kind string) string {
	if kind == tether {
		return e.tetherAgent
	}
	return e.upAgent
}

// startServer starts a proxy server of the given kind; the argv is the same for both kinds.
func (e *env) startServer(kind, mode, transport string) (*server, error) {
	e.seq++
	s := &server{kind: kind, mode: mode, transport: transport,
		name:      fmt.Sprintf("%02d-%s-server-%s-%s", e.seq, kind, mode, transport),
		agentPort: freePort(), health: freePort(), admin: freePort()}
	args := []string{"--mode=" + mode}
	switch transport {
	case "uds":
		s.uds = filepath.Join(e.work, "s", fmt.Sprintf("%02d.sock", e.seq))
		args = append(args, "--uds-name="+s.uds, "--server-port=0")
	case "tcp":
		port := freePort()
		s.front = "127.0.0.1:" + strconv.Itoa(port)
		args = append(args, "--server-bind-address=127.0.0.1", "--server-port="+strconv.Itoa(port),
			"--server-cert="+e.pki("server.crt"), "--server-key="+e.pki("server.key"),
			"--server-ca-cert="+e.pki("ca.crt"))
	}
	args = append(args,
		"--agent-bind-address=127.0.0.1", "--agent-port="+strconv.Itoa(s.agentPort),
		"--health-bind-address=127.0.0.1", "--health-port="+strconv.Itoa(s.health),
		"--admin-bind-address=127.0.0.1", "--admin-port="+strconv.Itoa(s.admin),
		"--cluster-cert="+e.pki("server.crt"), "--cluster-key="+e.pki("server.key"),
		"--cluster-ca-cert="+e.pki("ca.crt"),
		"--server-count=1", "--server-id="+s.name, "-v=2")
	p, err := e.ps.start(s.name, e.serverBin(kind), args...)
	if err != nil {
		return nil, err
	}
	s.p = p
	if err := waitStatus(fmt.Sprintf("http://127.0.0.1:%d/healthz", s.health), 200, 30*time.Second); err != nil {
		return nil, fmt.Errorf("%s: %v\n%s", s.name, err, p.tail(20))
	}
	if err := e.writeEgressConfig(s); err != nil {
		return nil, err
	}
	return s, nil
}

// startAgent starts an agent of the given kind connected to s, and waits until it is ready.
func (e *env) startAgent(kind string, s *server) (*agent, error) {
	return e.startAgentVia(kind, s, "127.0.0.1", nil)
}

// startAgentVia is startAgent with the server dialed by host, and env as the agent's whole
// environment (nil: this program's).
func (e *env) startAgentVia(kind string, s *server, host string, env []string) (*agent, error) {
	e.seq++
	a := &agent{kind: kind, name: fmt.Sprintf("%02d-%s-agent", e.seq, kind), health: freePort(), admin: freePort()}
	args := []string{
		"--proxy-server-host=" + host, "--proxy-server-port=" + strconv.Itoa(s.agentPort),
		"--ca-cert=" + e.pki("ca.crt"), "--agent-cert=" + e.pki("agent.crt"), "--agent-key=" + e.pki("agent.key"),
		"--health-server-host=127.0.0.1", "--health-server-port=" + strconv.Itoa(a.health),
		"--admin-bind-address=127.0.0.1", "--admin-server-port=" + strconv.Itoa(a.admin),
		"--agent-id=" + a.name, "--sync-interval=200ms", "--sync-interval-cap=1s", "-v=2",
	}
	if kind == "tether" {
		// tether's topology labels travel in their own header: upstream servers must ignore it.
		args = append(args, "--agent-labels=zone=interop-a,region=interop")
	}
	p, err := e.ps.startEnv(a.name, e.agentBin(kind), env, args...)
	if err != nil {
		return nil, err
	}
	a.p = p
	if err := waitStatus(fmt.Sprintf("http://127.0.0.1:%d/readyz", a.health), 200, 30*time.Second); err != nil {
		return nil, fmt.Errorf("%s: %v\n%s", a.name, err, p.tail(20))
	}
	return a, nil
}

// waitAgents waits until s counts n agents.
func (s *server) waitAgents(n int) error {
	return waitMetric(s.metricsURL(), "konnectivity_network_proxy_server_ready_backend_connections", float64(n), 30*time.Second)
}

func (e *env) writeEgressConfig(s *server) error {
	var conn string
	switch {
	case s.mode == "grpc" && s.transport == "uds":
		conn = "    proxyProtocol: GRPC\n    transport:\n      uds:\n        udsName: " + s.uds + "\n"
	case s.mode == "http-connect" && s.transport == "uds":
		conn = "    proxyProtocol: HTTPConnect\n    transport:\n      uds:\n        udsName: " + s.uds + "\n"
	case s.mode == "http-connect" && s.transport == "tcp":
		conn = "    proxyProtocol: HTTPConnect\n    transport:\n      tcp:\n        url: https://" + s.front + "\n" +
			"        tlsConfig:\n          caBundle: " + e.pki("ca.crt") + "\n          clientCert: " + e.pki("client.crt") +
			"\n          clientKey: " + e.pki("client.key") + "\n"
	default:
		return nil // GRPC over TCP: kube-apiserver refuses it (k/k #126339)
	}
	s.egressConfig = filepath.Join(e.work, "egress-"+s.name+".yaml")
	return os.WriteFile(s.egressConfig, []byte("apiVersion: apiserver.k8s.io/v1beta1\nkind: EgressSelectorConfiguration\n"+
		"egressSelections:\n- name: cluster\n  connection:\n"+conn), 0o644)
}

// peerArgs returns the konnectivity-peer arguments that reach s the way its real users do:
// the Go konnectivity-client for a gRPC frontend, kube-apiserver's egress dialer for HTTP CONNECT.
func (e *env) peerArgs(s *server) []string {
	switch {
	case s.mode == "grpc" && s.transport == "uds":
		return []string{"client", "--uds", s.uds}
	case s.mode == "grpc":
		return []string{"client", "--tcp", s.front, "--ca", e.pki("ca.crt"), "--cert", e.pki("client.crt"), "--key", e.pki("client.key")}
	default:
		return []string{"egress", "--config", s.egressConfig}
	}
}

// peerName says which peer peerArgs uses, for the matrix.
func peerName(s *server) string {
	if s.mode == "grpc" {
		return "konnectivity-client"
	}
	return "kube-apiserver egress dialer"
}

func (e *env) peer(pb peerBin, base []string, kase string, extra ...string) (peerResult, error) {
	args := append(append(append([]string{}, base...), "--case", kase), extra...)
	return runTool(e.ctx, 90*time.Second, pb.path, args...)
}

// held is a konnectivity-peer echo that pauses halfway (--hold) so that something can happen
// to its connection meanwhile.
type held struct {
	hold   chan struct{}
	result chan peerResult
}

func (e *env) startHeld(pb peerBin, base []string, address string, bytes int64, hold time.Duration) (*held, error) {
	args := append(append([]string{}, base...), "--case", "echo", "--address", address,
		"--bytes", strconv.FormatInt(bytes, 10), "--hold", hold.String(), "--timeout", "60s")
	ctx, cancel := context.WithTimeout(e.ctx, 90*time.Second)
	cmd := exec.CommandContext(ctx, pb.path, args...)
	cmd.WaitDelay = 2 * time.Second
	stderr, err := cmd.StderrPipe()
	if err != nil {
		cancel()
		return nil, err
	}
	var out strings.Builder
	cmd.Stdout = &out
	if err := cmd.Start(); err != nil {
		cancel()
		return nil, err
	}
	h := &held{hold: make(chan struct{}), result: make(chan peerResult, 1)}
	go func() {
		defer cancel()
		sc := bufio.NewScanner(stderr)
		once := false
		for sc.Scan() {
			if sc.Text() == "HOLD" && !once {
				once = true
				close(h.hold)
			}
		}
		cmd.Wait()
		var r peerResult
		r.raw = out.String()
		if err := jsonUnmarshal([]byte(r.raw), &r); err != nil {
			r.Error = "no result: " + r.raw
		}
		h.result <- r
	}()
	return h, nil
}

func (a *agent) dials() float64 {
	v, _ := metric(a.metricsURL(), "konnectivity_network_proxy_agent_dial_duration_seconds_count")
	return v
}

func (a *agent) drainSignal() { a.p.signal(syscall.SIGTERM) }
