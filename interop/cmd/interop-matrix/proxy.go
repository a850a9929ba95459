package main

// Section 6: agents behind an HTTP proxy. Upstream's Go agent honours HTTPS_PROXY through
// grpc-go's default proxy mapper, tether's agent through its own; both must reach both
// servers through the same real proxy (tinyproxy, with Basic authentication), and go direct
// when NO_PROXY matches.
//
// The agents dial the server as `LocalHost`: Go's httpproxy (and tether, which follows it)
// never proxies `localhost` or a loopback IP, but compares the name before lower-casing it,
// so `LocalHost` is proxied while still resolving to loopback. The server certificate's
// `localhost` matches it (names compare case-insensitively). tinyproxy only reaches
// loopback names and the servers' agent ports.

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

const (
	proxiedHost = "LocalHost"
	proxyUser   = "interop"
	proxyPass   = "pw-6.a_b"
)

// proxyVariables are dropped from the agents' environment before a cell sets its own.
var proxyVariables = []string{"HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "NO_PROXY", "no_proxy", "ALL_PROXY", "all_proxy"}

type tinyproxy struct {
	port int
	log  string
	p    *proc
}

// startTinyproxy runs tinyproxy on loopback, allowing CONNECT to ports only, with Basic auth.
func (e *env) startTinyproxy(ports []int) (*tinyproxy, error) {
	dir := filepath.Join(e.work, "tinyproxy")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	filter := filepath.Join(dir, "filter")
	if err := os.WriteFile(filter, []byte("^127\\.0\\.0\\.1$\n^localhost$\n"), 0o644); err != nil {
		return nil, err
	}
	t := &tinyproxy{port: freePort(), log: filepath.Join(dir, "tinyproxy.log")}
	var conf strings.Builder
	fmt.Fprintf(&conf, "Port %d\nListen 127.0.0.1\nBind 127.0.0.1\nTimeout 30\nMaxClients 50\nAllow 127.0.0.1\n", t.port)
	for _, p := range ports {
		fmt.Fprintf(&conf, "ConnectPort %d\n", p)
	}
	fmt.Fprintf(&conf, "Filter %q\nFilterType ere\nFilterDefaultDeny Yes\nLogFile %q\nLogLevel Connect\nPidFile %q\nBasicAuth %s %s\n",
		filter, t.log, filepath.Join(dir, "tinyproxy.pid"), proxyUser, proxyPass)
	confPath := filepath.Join(dir, "tinyproxy.conf")
	if err := os.WriteFile(confPath, []byte(conf.String()), 0o644); err != nil {
		return nil, err
	}
	p, err := e.ps.start("tinyproxy", "tinyproxy", "-d", "-c", confPath)
	if err != nil {
		return nil, err
	}
	t.p = p
	if err := waitListening("127.0.0.1:"+strconv.Itoa(t.port), 10*time.Second); err != nil {
		return nil, fmt.Errorf("tinyproxy: %v\n%s", err, p.tail(10))
	}
	return t, nil
}

// waitListening waits until addr accepts a TCP connection.
func waitListening(addr string, within time.Duration) error {
	deadline := time.Now().Add(within)
	for {
		conn, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			return conn.Close()
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not listening after %v: %v", addr, within, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// connects counts the CONNECT requests for target in tinyproxy's log.
func (t *tinyproxy) connects(target string) int {
	text, _ := os.ReadFile(t.log)
	return strings.Count(string(text), "): CONNECT "+target+" ")
}

// agentEnv is this program's environment without proxy variables, plus set.
func agentEnv(set ...string) []string {
	var env []string
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		drop := false
		for _, v := range proxyVariables {
			drop = drop || name == v
		}
		if !drop {
			env = append(env, kv)
		}
	}
	return append(env, set...)
}

func (e *env) section6() error {
	if _, err := exec.LookPath("tinyproxy"); err != nil {
		return fmt.Errorf("tinyproxy is not installed (scripts/test-all.sh installs it from Debian's packages): %v", err)
	}
	pb := e.peers[0]
	var servers []*server
	for _, kind := range []string{upstream, tether} {
		s, err := e.startServer(kind, "grpc", "uds")
		if err != nil {
			return err
		}
		defer s.p.stop()
		servers = append(servers, s)
	}
	proxy, err := e.startTinyproxy([]int{servers[0].agentPort, servers[1].agentPort})
	if err != nil {
		return err
	}
	defer proxy.p.stop()
	proxyURL := fmt.Sprintf("http://%s:%s@127.0.0.1:%d", proxyUser, proxyPass, proxy.port)
	for _, s := range servers {
		target := proxiedHost + ":" + strconv.Itoa(s.agentPort)
		for _, agentKind := range []string{upstream, tether} {
			for _, direct := range []bool{false, true} {
				env := []string{"HTTPS_PROXY=" + proxyURL}
				how := "agent → HTTP proxy (Basic auth) → " + s.kind + " proxy-server"
				if direct {
					env = append(env, "NO_PROXY="+proxiedHost)
					how = "agent → " + s.kind + " proxy-server, NO_PROXY matching the server"
				}
				version := "tether"
				if agentKind == upstream {
					version = "proxy-agent " + e.upVersion
				}
				c := e.newCell("6", agentKind+" proxy-agent", version, "gRPC", "UDS", how)
				before := proxy.connects(target)
				var a *agent
				c.run("the agent connects (HTTPS_PROXY with user info; the server dialed as "+proxiedHost+")", func() (string, error) {
					var err error
					if a, err = e.startAgentVia(agentKind, s, proxiedHost, agentEnv(env...)); err != nil {
						return "", err
					}
					return "ready", s.waitAgents(1)
				})
				if a == nil {
					continue
				}
				if s.kind == tether {
					c.run("tether's server counts the agent as "+agentKind+"'s (tether_server_connected_agents)", func() (string, error) {
						if agentKind == upstream {
							return implementations(s, 1, 0)
						}
						return implementations(s, 0, 1)
					})
				}
				c.run("GET / through the tunnel → 200", func() (string, error) {
					return expectOK(e.peer(pb, e.peerArgs(s), "get", "--address", e.http))
				})
				if direct {
					c.run("NO_PROXY: the proxy saw no CONNECT", func() (string, error) {
						if n := proxy.connects(target) - before; n != 0 {
							return "", fmt.Errorf("%d CONNECT %s through the proxy", n, target)
						}
						return "direct", nil
					})
				} else {
					c.run("the proxy saw CONNECT "+proxiedHost+":(the agent port)", func() (string, error) {
						if n := proxy.connects(target) - before; n < 1 {
							return "", fmt.Errorf("no CONNECT %s in tinyproxy's log", target)
						}
						return "CONNECT " + target, nil
					})
				}
				a.p.signal(syscall.SIGKILL)
				a.p.wait(10 * time.Second)
				if err := s.waitAgents(0); err != nil {
					return fmt.Errorf("%s: the killed agent is still counted: %v", s.name, err)
				}
			}
		}
	}
	return nil
}
