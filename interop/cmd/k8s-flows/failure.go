package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"regexp"
	"strings"
	"syscall"
	"time"
)

// killCase is one stream open through the proxy while its agent is killed with SIGKILL
// (upstream issue #748): what kubectl sees, and whether the proxy server ended the
// kube-apiserver side of the connection with an error.
type killCase struct {
	flow     string
	kubectl  string // exit code as kubectl reported it, or "still running" at the deadline
	stderr   string // kubectl's last stderr line, normalized
	local    string // port-forward: what the open local connection saw
	closed   string // tether: the server's connection-closes metric; upstream: not measured
	released string // the server's established_connections fell to 0
	err      error  // an assertion about tether failed
	exitedIn time.Duration
	localIn  time.Duration
}

// killResumeWindow is the tether server's --resume-window in these flows: how long a
// killed agent's connections wait to be resumed before they end with an error.
const killResumeWindow = "2s"

const (
	closesMetric      = "tether_server_connection_closes_total"
	establishedMetric = "konnectivity_network_proxy_server_established_connections"
	execFlow          = "exec (streaming command)"
)

// runKills runs each streaming flow, kills the agent under it, records the outcome, and
// restarts the agent for the next one.
func (e *env) runKills(ctx context.Context, r *row, c *cluster, p *proxy) {
	cases := []struct {
		flow  string
		start func() (*stream, net.Conn, error)
	}{
		{execFlow, func() (*stream, net.Conn, error) {
			s, err := e.kubectl(ctx, c, 90*time.Second, "exec", "pod-a", "--", "sh", "-c",
				"i=0; while [ $i -lt 600 ]; do i=$((i+1)); echo tick $i; sleep 0.1; done").start()
			if err != nil {
				return nil, nil, err
			}
			return s, nil, s.waitLine("tick 3", 20*time.Second)
		}},
		{"logs -f", func() (*stream, net.Conn, error) {
			s, err := e.kubectl(ctx, c, 90*time.Second, "logs", "-f", "pod-a").start()
			if err != nil {
				return nil, nil, err
			}
			return s, nil, s.waitLine("flow-line-1", 20*time.Second)
		}},
		{"port-forward (open connection)", func() (*stream, net.Conn, error) {
			local := freePort()
			s, err := e.kubectl(ctx, c, 90*time.Second, "port-forward", "--address=127.0.0.1", "pod/pod-a",
				fmt.Sprintf("%d:%d", local, podEchoPort)).start()
			if err != nil {
				return nil, nil, err
			}
			if err := s.waitLine("Forwarding from", 20*time.Second); err != nil {
				return s, nil, err
			}
			conn, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", local), 5*time.Second)
			if err != nil {
				return s, nil, err
			}
			// An echo round trip proves the connection is open end to end before the kill.
			_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
			buf := make([]byte, 5)
			if _, err := conn.Write([]byte("ping\n")); err != nil {
				return s, conn, err
			}
			if _, err := io.ReadFull(conn, buf); err != nil || string(buf) != "ping\n" {
				return s, conn, fmt.Errorf("echo through the forward: %q %v", buf, err)
			}
			return s, conn, nil
		}},
	}
	for _, kc := range cases {
		k := killCase{flow: kc.flow}
		before, _ := metricSum(p.metricsURL(), closesMetric, `initiator="agent"`, `outcome="error"`)
		s, conn, err := startKillCase(kc.start)
		if err != nil {
			k.err = fmt.Errorf("setting up: %v", err)
		} else {
			k = e.killAgent(p, kc.flow, s, conn, before)
		}
		if s != nil {
			s.stop()
		}
		if conn != nil {
			conn.Close()
		}
		r.kills = append(r.kills, k)
		status := "ok"
		if k.err != nil {
			status = "FAIL: " + k.err.Error()
		}
		fmt.Printf("   kill -9 agent during %-30s kubectl %s after %v, stderr %q, local %q after %v, released %q, server %q: %s\n",
			kc.flow, k.kubectl, k.exitedIn.Round(100*time.Millisecond), k.stderr, k.local, k.localIn.Round(100*time.Millisecond), k.released, k.closed, status)
		// A fresh agent for the next case (and a failed restart fails the rest of the row).
		if p.agent.exited() {
			if err := e.startAgent(p, c); err != nil {
				r.err = err
				return
			}
		}
	}
}

// setupAttempts bounds how often a kill case's stream is set up before the kill: the
// observation is what the kill does to an open stream, so a stream that never opened (right
// after the previous case's agent restart, upstream's server may still pick the agent it lost)
// is set up again rather than recorded.
const setupAttempts = 3

// startKillCase runs start until the stream is up, at most setupAttempts times, 2 s apart;
// the error is the last attempt's.
func startKillCase(start func() (*stream, net.Conn, error)) (*stream, net.Conn, error) {
	for attempt := 1; ; attempt++ {
		s, conn, err := start()
		if err == nil || attempt == setupAttempts {
			return s, conn, err
		}
		fmt.Printf("   (set-up attempt %d failed: %v; trying again)\n", attempt, err)
		if s != nil {
			s.stop()
		}
		if conn != nil {
			conn.Close()
		}
		time.Sleep(2 * time.Second)
	}
}

func (e *env) killAgent(p *proxy, flow string, s *stream, conn net.Conn, before float64) killCase {
	k := killCase{flow: flow}
	p.agent.kill9()
	killed := time.Now()
	var errs []string
	if p.impl == tether {
		// tether ends each affected connection with an error: a TCP reset on HTTP CONNECT,
		// CLOSE_RSP with an error on gRPC. Seconds, not the 30 s+ of a hanging stream.
		if v, err := waitMetricAtLeast(p.metricsURL(), closesMetric, before+1, 10*time.Second, `initiator="agent"`, `outcome="error"`); err != nil {
			errs = append(errs, "server did not end the connection with an error: "+err.Error())
			k.closed = "no"
		} else {
			k.closed = fmt.Sprintf("yes: `%s{initiator=\"agent\",outcome=\"error\"}` rose within 10 s", closesMetric)
			fmt.Printf("   %s{agent,error} +%v after %v\n", closesMetric, v-before, time.Since(killed).Round(10*time.Millisecond))
		}
	}
	// Both servers: every connection through the dead agent is gone from the server's books.
	if err := waitMetricAtMost(p.metricsURL(), establishedMetric, 0, 10*time.Second); err != nil {
		errs = append(errs, "established connections not released: "+err.Error())
		k.released = "no"
	} else {
		k.released = "yes, within 10 s"
	}
	if p.impl != tether {
		k.closed = "not measured (upstream has no such metric)"
	}
	if conn != nil {
		k.local = readAfterKill(conn, 20*time.Second)
		k.localIn = time.Since(killed)
		if p.impl == tether && !strings.HasPrefix(k.local, "closed") {
			errs = append(errs, "the open port-forward connection was not closed: "+k.local)
		}
	}
	res := s.wait(30 * time.Second)
	k.exitedIn = s.s.ExitedAt().Sub(killed)
	if res.exit == -1 {
		k.kubectl = "still running after 30 s (killed)"
		if p.impl == tether && conn == nil {
			errs = append(errs, "kubectl "+flow+" hung after the agent was killed")
		}
	} else {
		k.kubectl = fmt.Sprintf("exit %d", res.exit)
	}
	k.stderr = lastLine(res.stderr)
	if flow == execFlow && res.exit == 0 && !strings.Contains(res.stdout, "tick 600\n") {
		// Exit 0 from a command that was cut off: the tunnel error became a clean success.
		k.kubectl += ", stdout cut off before the command's last line"
	}
	if len(errs) > 0 {
		k.err = errors.New(strings.Join(errs, "; "))
	}
	return k
}

// readAfterKill reads the port-forward's local connection until it ends, for at most d.
func readAfterKill(conn net.Conn, d time.Duration) string {
	_ = conn.SetReadDeadline(time.Now().Add(d))
	_, err := io.Copy(io.Discard, conn)
	var ne net.Error
	switch {
	case err == nil:
		return "closed (EOF)"
	case errors.Is(err, syscall.ECONNRESET):
		return "closed (reset)"
	case errors.As(err, &ne) && ne.Timeout():
		return "still open after " + d.String()
	case errors.Is(err, os.ErrDeadlineExceeded):
		return "still open after " + d.String()
	default:
		return "closed (" + err.Error() + ")"
	}
}

var (
	klogPrefix = regexp.MustCompile(`^[IWEF]\d{4} \d\d:\d\d:\d\d\.\d+\s+\d+ [^\]]+\] `)
	portRE     = regexp.MustCompile(`(127\.0\.0\.[0-9]+|localhost):\d+`)
	podAddrRE  = regexp.MustCompile(`198\.1[89]\.\d+\.\d+:\d+`)
	sockRE     = regexp.MustCompile(`/[^\s"']*\.sock`)
	tmpRE      = regexp.MustCompile(`/tmp/[^\s"']*`)
)

// lastLine is kubectl's last stderr line without what differs between runs (klog headers,
// ports, paths), so the report is stable.
func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	l := strings.TrimSpace(lines[len(lines)-1])
	l = klogPrefix.ReplaceAllString(l, "")
	l = portRE.ReplaceAllString(l, "$1:PORT")
	l = podAddrRE.ReplaceAllString(l, "POD_IP:PORT")
	l = sockRE.ReplaceAllString(l, "UDS")
	l = tmpRE.ReplaceAllString(l, "PATH")
	if l == "" {
		return "(none)"
	}
	return l
}
