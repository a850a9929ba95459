package main

import (
	"fmt"
	"strings"
	"syscall"
	"time"
)

// topo is a server with zero or one agent; topologies are started on first use and shared.
type topo struct {
	s *server
	a *agent
}

type topoKey struct{ tag, serverKind, agentKind, mode, transport string }

func (e *env) topo(serverKind, agentKind, mode, transport string) (topo, error) {
	return e.taggedTopo("", serverKind, agentKind, mode, transport)
}

// taggedTopo is topo, but a different tag gets a topology of its own.
func (e *env) taggedTopo(tag, serverKind, agentKind, mode, transport string) (topo, error) {
	k := topoKey{tag, serverKind, agentKind, mode, transport}
	if t, ok := e.topos[k]; ok {
		return t, nil
	}
	s, err := e.startServer(serverKind, mode, transport)
	if err != nil {
		return topo{}, err
	}
	t := topo{s: s}
	if agentKind != "" {
		if t.a, err = e.startAgent(agentKind, s); err != nil {
			return topo{}, err
		}
		if err := s.waitAgents(1); err != nil {
			return topo{}, err
		}
	}
	e.topos[k] = t
	return t, nil
}

func direction(serverKind, agentKind string) string {
	d := serverKind + " proxy-server → " + agentKind + " proxy-agent"
	if serverKind == upstream && agentKind == upstream {
		d += " (reference)"
	}
	return d
}

var transportName = map[string]string{"uds": "UDS", "tcp": "TCP+mTLS"}

func frontendName(mode string) string {
	if mode == "grpc" {
		return "gRPC"
	}
	return "HTTP CONNECT"
}

// released checks that the server and the agent of t hold no connection any more.
func released(t topo) error {
	if err := waitMetric(t.s.metricsURL(), "konnectivity_network_proxy_server_established_connections", 0, 5*time.Second); err != nil {
		return err
	}
	return waitMetric(t.a.metricsURL(), "konnectivity_network_proxy_agent_open_endpoint_connections", 0, 5*time.Second)
}

// sameFailure compares a failed dial with upstream's reference for the same case.
func sameFailure(got, ref peerResult) (string, error) {
	detail := fmt.Sprintf("reason=%q error=%q", got.Reason, got.DialError)
	if !got.OK {
		return detail, fmt.Errorf("%s", got)
	}
	if !ref.OK {
		return detail, fmt.Errorf("no reference: upstream's run failed: %s", ref)
	}
	if got.Reason != ref.Reason || normalize(got.DialError) != normalize(ref.DialError) {
		return detail, fmt.Errorf("differs from upstream's: reason=%q error=%q", ref.Reason, ref.DialError)
	}
	return detail, nil
}

// traffic runs the common data checks through t with the peer that suits its frontend.
func (e *env) traffic(c *cell, pb peerBin, t topo, echoBytes, bulk int64) {
	base := e.peerArgs(t.s)
	c.run("GET / through the tunnel → 200", func() (string, error) {
		return expectOK(e.peer(pb, base, "get", "--address", e.http))
	})
	c.run(fmt.Sprintf("echo %d MiB, byte-exact", echoBytes), func() (string, error) {
		return expectOK(e.peer(pb, base, "echo", "--address", e.echo, "--bytes", mib(echoBytes)))
	})
	c.run(fmt.Sprintf("upload %d MiB (to the target), SHA-256 checked", bulk), func() (string, error) {
		return expectOK(e.peer(pb, base, "upload", "--address", e.http, "--bytes", mib(bulk)))
	})
	c.run(fmt.Sprintf("download %d MiB (from the target), content checked", bulk), func() (string, error) {
		return expectOK(e.peer(pb, base, "download", "--address", e.http, "--bytes", mib(bulk)))
	})
}

// refusedCheck dials a closed port through t and compares the failure with ref's (nil: t is
// the reference itself, whose result is returned for later comparisons).
func (e *env) refusedCheck(c *cell, pb peerBin, t topo, ref *peerResult, wantReason string) peerResult {
	var got peerResult
	c.run("refused destination: "+wantReason+" failure, error text as upstream's", func() (string, error) {
		var err error
		got, err = e.peer(pb, e.peerArgs(t.s), "dial-error", "--address", e.refused, "--expect-reason", wantReason)
		if err != nil {
			return "", err
		}
		if ref == nil {
			if !strings.Contains(got.DialError, "connection refused") {
				return got.DialError, fmt.Errorf("%s", got)
			}
			return fmt.Sprintf("reason=%q error=%q", got.Reason, got.DialError), nil
		}
		return sameFailure(got, *ref)
	})
	return got
}

func wantReason(s *server) string {
	if s.mode == "grpc" {
		return "endpoint" // konnectivity-client's GetDialFailureReason
	}
	return "proxy" // kube-apiserver's apiserver_egress_dialer_dial_failure_count stage
}

func failedUnlessOK(r peerResult) error {
	if r.OK {
		return nil
	}
	return fmt.Errorf("%s", r)
}

// ---- 1. the Go konnectivity-client ----

func (e *env) section1() error {
	for _, pb := range e.peers {
		var refRefused, refNoAgent *peerResult
		for _, kind := range []string{upstream, tether} {
			t, err := e.topo(kind, kind, "grpc", "uds")
			if err != nil {
				return err
			}
			none, err := e.topo(kind, "", "grpc", "uds")
			if err != nil {
				return err
			}
			c := e.newCell("1", "Go konnectivity-client", pb.client(), "gRPC", "UDS", direction(kind, kind))
			base := e.peerArgs(t.s)
			c.run("dial, echo 64 KiB in 1000-byte writes, byte-exact", func() (string, error) {
				return expectOK(e.peer(pb, base, "echo", "--address", e.echo, "--bytes", "65536", "--chunk", "1000"))
			})
			e.traffic(c, pb, t, 16, 32)
			r := e.refusedCheck(c, pb, t, refRefused, "endpoint")
			if refRefused == nil {
				refRefused = &r
			}
			c.run("no agent: failure reason and error text as upstream's", func() (string, error) {
				got, err := e.peer(pb, e.peerArgs(none.s), "dial-error", "--address", e.echo, "--timeout", "20s")
				if err != nil {
					return "", err
				}
				if refNoAgent == nil {
					refNoAgent = &got
					return fmt.Sprintf("reason=%q error=%q", got.Reason, got.DialError), failedUnlessOK(got)
				}
				return sameFailure(got, *refNoAgent)
			})
			c.run("close from the client: CLOSE_RSP in time, tunnel ends, both ends release it", func() (string, error) {
				d, err := expectOK(e.peer(pb, base, "close-client", "--address", e.echo))
				if err != nil {
					return d, err
				}
				return d, released(t)
			})
			c.run("close from the target: client reads EOF, tunnel ends, both ends release it", func() (string, error) {
				d, err := expectOK(e.peer(pb, base, "close-remote", "--address", e.http))
				if err != nil {
					return d, err
				}
				return d, released(t)
			})
			if pb.versions["reusable-tunnel"] == "yes" {
				// A topology of its own: upstream's server keeps established entries long after
				// a reusable tunnel closes (see COMPATIBILITY.md), which must not leak into the
				// release checks above on the shared one.
				rt, err := e.taggedTopo("reusable", kind, kind, "grpc", "uds")
				if err != nil {
					return err
				}
				c.run("reusable tunnel (CreateGRPCTunnel): 16 concurrent streams on one connection, 1 MiB echo each, Close ends it", func() (string, error) {
					return expectOK(e.peer(pb, e.peerArgs(rt.s), "reusable", "--address", e.echo, "--bytes", mib(1), "--streams", "16"))
				})
				if kind == tether {
					c.run("after that Close, server and agent hold no connection (upstream's server lags here: see Differences)", func() (string, error) {
						return "", released(rt)
					})
				}
			}
		}
	}
	return nil
}

// ---- 2. kube-apiserver's egress selector ----

func (e *env) section2() error {
	configs := []struct {
		mode, transport, protocol string
		noAgent                   bool
	}{
		{"http-connect", "uds", "HTTPConnect", true},
		{"http-connect", "tcp", "HTTPConnect", false},
		{"grpc", "uds", "GRPC", true},
	}
	for _, pb := range e.peers {
		for _, cf := range configs {
			var refRefused, refNoAgent *peerResult
			for _, kind := range []string{upstream, tether} {
				t, err := e.topo(kind, kind, cf.mode, cf.transport)
				if err != nil {
					return err
				}
				c := e.newCell("2", "kube-apiserver egress dialer", pb.apiserver()+" ("+pb.client()+")",
					cf.protocol, transportName[cf.transport], direction(kind, kind))
				base := []string{"egress", "--config", t.s.egressConfig}
				c.run("GET / → 200", func() (string, error) {
					return expectOK(e.peer(pb, base, "get", "--address", e.http))
				})
				c.run("GET 8 MiB, content checked", func() (string, error) {
					return expectOK(e.peer(pb, base, "download", "--address", e.http, "--bytes", mib(8)))
				})
				c.run("refused destination: stage proxy, error text as upstream's", func() (string, error) {
					got, err := e.peer(pb, base, "dial-error", "--address", e.refused, "--expect-reason", "proxy")
					if err != nil {
						return "", err
					}
					if refRefused == nil {
						refRefused = &got
						return fmt.Sprintf("reason=%q error=%q", got.Reason, got.DialError), failedUnlessOK(got)
					}
					return sameFailure(got, *refRefused)
				})
				if cf.noAgent {
					none, err := e.topo(kind, "", cf.mode, cf.transport)
					if err != nil {
						return err
					}
					c.run("no agent: stage proxy, error text as upstream's", func() (string, error) {
						got, err := e.peer(pb, []string{"egress", "--config", none.s.egressConfig}, "dial-error",
							"--address", e.echo, "--expect-reason", "proxy", "--timeout", "20s")
						if err != nil {
							return "", err
						}
						if refNoAgent == nil {
							refNoAgent = &got
							return fmt.Sprintf("reason=%q error=%q", got.Reason, got.DialError), failedUnlessOK(got)
						}
						return sameFailure(got, *refNoAgent)
					})
				}
			}
		}
	}
	return nil
}

// ---- 3. mixed pairs ----

func (e *env) section3() error {
	pb := e.peers[0]
	frontends := [][2]string{{"grpc", "uds"}, {"grpc", "tcp"}, {"http-connect", "uds"}, {"http-connect", "tcp"}}
	for _, pair := range [][2]string{{tether, upstream}, {upstream, tether}} {
		for _, f := range frontends {
			ref, err := e.topo(upstream, upstream, f[0], f[1])
			if err != nil {
				return err
			}
			t, err := e.topo(pair[0], pair[1], f[0], f[1])
			if err != nil {
				return err
			}
			peerLabel, version := upstreamPeer(pair[0], e.upVersion)
			c := e.newCell("3", peerLabel, version, frontendName(f[0]), transportName[f[1]], direction(pair[0], pair[1]))
			e.traffic(c, pb, t, 4, 16)
			if pair[0] == tether {
				c.run("tether's server counts the agent as upstream's (tether_server_connected_agents)", func() (string, error) {
					return implementations(t.s, 1, 0)
				})
			}
			reason := wantReason(t.s)
			var refResult peerResult
			c.run("refused destination: "+reason+" failure, error text as upstream's", func() (string, error) {
				var err error
				refResult, err = e.peer(pb, e.peerArgs(ref.s), "dial-error", "--address", e.refused, "--expect-reason", reason)
				if err != nil {
					return "", err
				}
				got, err := e.peer(pb, e.peerArgs(t.s), "dial-error", "--address", e.refused, "--expect-reason", reason)
				if err != nil {
					return "", err
				}
				return sameFailure(got, refResult)
			})
		}
		for _, f := range [][2]string{{"grpc", "uds"}, {"http-connect", "uds"}} {
			if err := e.drainCell(pb, pair[0], pair[1], f[0], f[1]); err != nil {
				return err
			}
		}
	}
	return nil
}

// implementations checks a tether server's count of connected agents by implementation.
func implementations(s *server, wantUpstream, wantTether float64) (string, error) {
	const name = "tether_server_connected_agents"
	up, err := metric(s.metricsURL(), name+`{implementation="upstream"}`)
	if err != nil {
		return "", err
	}
	own, err := metric(s.metricsURL(), name+`{implementation="tether"}`)
	if err != nil {
		return "", err
	}
	got := fmt.Sprintf("upstream %v, tether %v", up, own)
	if up != wantUpstream || own != wantTether {
		return got, fmt.Errorf("want upstream %v, tether %v", wantUpstream, wantTether)
	}
	return got, nil
}

// upstreamPeer names the upstream side of a mixed pair whose server is serverKind's.
func upstreamPeer(serverKind, version string) (string, string) {
	if serverKind == tether {
		return "upstream proxy-agent", "proxy-agent " + version
	}
	return "upstream proxy-server", "proxy-server " + version
}

// drainCell: one server, two agents. A connection is held open through one agent, which then
// gets SIGTERM (it sends DRAIN). The held connection must complete, new dials must go to the
// other agent, and when both drain dials must still be served (upstream falls back to draining
// agents). A second SIGTERM stops each agent.
func (e *env) drainCell(pb peerBin, serverKind, agentKind, mode, transport string) error {
	s, err := e.startServer(serverKind, mode, transport)
	if err != nil {
		return err
	}
	defer s.p.stop()
	var agents [2]*agent
	for i := range agents {
		if agents[i], err = e.startAgent(agentKind, s); err != nil {
			return err
		}
		defer agents[i].p.stop()
	}
	if err := s.waitAgents(2); err != nil {
		return err
	}
	peerLabel, version := upstreamPeer(serverKind, e.upVersion)
	c := e.newCell("3", peerLabel, version, frontendName(mode), transportName[transport],
		direction(serverKind, agentKind)+": drain")
	base := e.peerArgs(s)

	var drained, kept *agent
	c.run("SIGTERM (DRAIN) to the agent holding a connection: that connection completes", func() (string, error) {
		before := [2]float64{agents[0].dials(), agents[1].dials()}
		h, err := e.startHeld(pb, base, e.echo, 2<<20, 3*time.Second)
		if err != nil {
			return "", err
		}
		select {
		case <-h.hold:
		case r := <-h.result:
			return "", fmt.Errorf("held echo ended early: %s %s", r, r.Error)
		case <-time.After(30 * time.Second):
			return "", fmt.Errorf("held echo never reached its pause")
		}
		for i, a := range agents {
			if a.dials() > before[i] {
				drained, kept = a, agents[1-i]
			}
		}
		if drained == nil {
			return "", fmt.Errorf("no agent counted the held connection's dial")
		}
		drained.drainSignal()
		time.Sleep(time.Second)
		if drained.p.exited() {
			return "", fmt.Errorf("agent exited on the first SIGTERM")
		}
		r := <-h.result
		if !r.OK {
			return "", fmt.Errorf("held connection through the draining agent failed: %s", r)
		}
		return "held 2 MiB echo completed after the drain", nil
	})
	if drained == nil {
		return nil
	}
	c.run("new dials go to the agent that is not draining (8 of 8)", func() (string, error) {
		d0, k0 := drained.dials(), kept.dials()
		for i := 0; i < 8; i++ {
			if _, err := expectOK(e.peer(pb, base, "get", "--address", e.http)); err != nil {
				return "", err
			}
		}
		dd, kd := drained.dials()-d0, kept.dials()-k0
		if dd != 0 || kd != 8 {
			return "", fmt.Errorf("draining agent took %v dials, the other %v", dd, kd)
		}
		return "", nil
	})
	c.run("every agent draining: dials are still served", func() (string, error) {
		kept.drainSignal()
		time.Sleep(time.Second)
		return expectOK(e.peer(pb, base, "get", "--address", e.http))
	})
	c.run("second SIGTERM stops each agent within 5 s", func() (string, error) {
		for _, a := range agents {
			a.p.signal(syscall.SIGTERM)
		}
		for _, a := range agents {
			if !a.p.wait(5 * time.Second) {
				return "", fmt.Errorf("%s still running", a.name)
			}
		}
		return "", nil
	})
	return nil
}
