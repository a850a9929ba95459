package main

// Section 5: the TLS 1.3 key exchange group that Go's crypto/tls (this program's Go, 1.26)
// negotiates with tether in each direction, read from tls.ConnectionState().CurveID. Go
// 1.24+ offers and prefers the post-quantum hybrid X25519MLKEM768; tether must pick it too,
// and still serve a Go peer restricted to X25519 (CurvePreferences), as an older peer is.
//
// The Go side is configured as each real peer configures it: upstream's agent with
// util.GetClientTLSConfig, the Go konnectivity-client's callers and kube-apiserver's egress
// dialer with a client certificate and RootCAs only, upstream's proxy-server agent listener
// as its cmd/server/app builds it. tether's side is the real binary.

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"os"
	"strconv"
	"time"

	"sigs.k8s.io/apiserver-network-proxy/pkg/util"
)

const handshakeTimeout = 10 * time.Second

// curveSets are the Go peer's CurvePreferences: Go's default, and X25519 alone.
var curveSets = []struct {
	label  string
	curves []tls.CurveID
	want   tls.CurveID
}{
	{"Go default curves", nil, tls.X25519MLKEM768},
	{"CurvePreferences X25519 only", []tls.CurveID{tls.X25519}, tls.X25519},
}

func (e *env) section5() error {
	type frontend struct{ mode, peer, version string }
	for _, kind := range []string{upstream, tether} {
		for _, f := range []frontend{
			{"grpc", "Go konnectivity-client's TLS (client cert, RootCAs, ALPN h2)", "konnectivity-client"},
			{"http-connect", "kube-apiserver egress dialer's TLS (client cert, RootCAs)", "k8s.io/apiserver"},
		} {
			t, err := e.topo(kind, "", f.mode, "tcp")
			if err != nil {
				return err
			}
			for _, cs := range curveSets {
				c := e.groupCell(f.peer, cs.label, frontendName(f.mode)+" frontend", "Go client → "+kind+" proxy-server")
				c.run("handshake; CurveID is "+cs.want.String(), func() (string, error) {
					cfg, err := frontendClientTLS(e.pki("ca.crt"), e.pki("client.crt"), e.pki("client.key"), f.mode)
					if err != nil {
						return "", err
					}
					cfg.CurvePreferences = cs.curves
					got, err := goDial(t.s.front, cfg)
					return c.expectGroup(got, err, cs.want)
				})
			}
		}
		t, err := e.topo(kind, "", "grpc", "tcp")
		if err != nil {
			return err
		}
		for _, cs := range curveSets {
			c := e.groupCell("upstream proxy-agent's TLS (util.GetClientTLSConfig)", cs.label, "agent listener",
				"Go agent → "+kind+" proxy-server")
			c.run("handshake; CurveID is "+cs.want.String(), func() (string, error) {
				cfg, err := util.GetClientTLSConfig(e.pki("ca.crt"), e.pki("agent.crt"), e.pki("agent.key"), "127.0.0.1", nil)
				if err != nil {
					return "", err
				}
				cfg.CurvePreferences = cs.curves
				got, err := goDial("127.0.0.1:"+strconv.Itoa(t.s.agentPort), cfg)
				return c.expectGroup(got, err, cs.want)
			})
		}
	}
	for _, kind := range []string{upstream, tether} {
		for _, cs := range curveSets {
			c := e.groupCell("upstream proxy-server's agent listener TLS (cmd/server/app)", cs.label, "agent dialer",
				kind+" proxy-agent → Go server")
			c.run("handshake; CurveID is "+cs.want.String(), func() (string, error) {
				got, err := e.agentToGoServer(kind, cs.curves)
				return c.expectGroup(got, err, cs.want)
			})
		}
	}
	return nil
}

func (e *env) groupCell(peer, curves, endpoint, direction string) *cell {
	return e.newCell("5", peer, curves, endpoint, "TCP+mTLS", direction)
}

// expectGroup records the negotiated group on the cell and checks it.
func (c *cell) expectGroup(got tls.CurveID, err error, want tls.CurveID) (string, error) {
	if err != nil {
		return "", err
	}
	c.group = got.String()
	if got != want {
		return c.group, fmt.Errorf("negotiated %s, want %s", got, want)
	}
	return c.group, nil
}

// frontendClientTLS is the TLS config a frontend client brings: a client certificate and the
// CA, as kube-apiserver's egress selector builds it from its tlsConfig, plus ALPN h2 where gRPC
// (grpc-go's credentials.NewTLS) adds it.
func frontendClientTLS(ca, cert, key, mode string) (*tls.Config, error) {
	pair, err := tls.LoadX509KeyPair(cert, key)
	if err != nil {
		return nil, err
	}
	pool, err := caPool(ca)
	if err != nil {
		return nil, err
	}
	cfg := &tls.Config{Certificates: []tls.Certificate{pair}, RootCAs: pool, ServerName: "127.0.0.1"}
	if mode == "grpc" {
		cfg.NextProtos = []string{"h2"}
	}
	return cfg, nil
}

func caPool(path string) (*x509.CertPool, error) {
	pem, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("no certificate in %s", path)
	}
	return pool, nil
}

// goDial completes one TLS handshake with addr and returns the group it used.
func goDial(addr string, cfg *tls.Config) (tls.CurveID, error) {
	d := &net.Dialer{Timeout: handshakeTimeout}
	conn, err := tls.DialWithDialer(d, "tcp", addr, cfg)
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	return conn.ConnectionState().CurveID, nil
}

// agentToGoServer points an agent of the given kind at a Go TLS listener configured as
// upstream's proxy-server configures its agent listener, and returns the group of the
// agent's first handshake. The agent is stopped before returning.
func (e *env) agentToGoServer(kind string, curves []tls.CurveID) (tls.CurveID, error) {
	cert, err := tls.LoadX509KeyPair(e.pki("server.crt"), e.pki("server.key"))
	if err != nil {
		return 0, err
	}
	pool, err := caPool(e.pki("ca.crt"))
	if err != nil {
		return 0, err
	}
	cfg := &tls.Config{ClientAuth: tls.RequireAndVerifyClientCert, Certificates: []tls.Certificate{cert},
		ClientCAs: pool, MinVersion: tls.VersionTLS12, NextProtos: []string{"h2"}, CurvePreferences: curves}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	e.seq++
	name := fmt.Sprintf("%02d-%s-agent-to-go-server", e.seq, kind)
	p, err := e.ps.start(name, e.agentBin(kind),
		"--proxy-server-host=127.0.0.1", "--proxy-server-port="+strconv.Itoa(ln.Addr().(*net.TCPAddr).Port),
		"--ca-cert="+e.pki("ca.crt"), "--agent-cert="+e.pki("agent.crt"), "--agent-key="+e.pki("agent.key"),
		"--health-server-host=127.0.0.1", "--health-server-port="+strconv.Itoa(freePort()),
		"--admin-bind-address=127.0.0.1", "--admin-server-port="+strconv.Itoa(freePort()),
		"--agent-id="+name, "-v=2")
	if err != nil {
		return 0, err
	}
	defer p.stop()
	if err := ln.(*net.TCPListener).SetDeadline(time.Now().Add(30 * time.Second)); err != nil {
		return 0, err
	}
	raw, err := ln.Accept()
	if err != nil {
		return 0, fmt.Errorf("no connection from the agent within 30 s: %v\n%s", err, p.tail(10))
	}
	conn := tls.Server(raw, cfg)
	defer conn.Close()
	if err := conn.SetDeadline(time.Now().Add(handshakeTimeout)); err != nil {
		return 0, err
	}
	if err := conn.Handshake(); err != nil {
		return 0, fmt.Errorf("handshake with the agent: %v", err)
	}
	return conn.ConnectionState().CurveID, nil
}
