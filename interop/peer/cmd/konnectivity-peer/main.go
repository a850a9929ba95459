// konnectivity-peer drives a Konnectivity proxy server the way its real Go
// peers do, with whatever versions of upstream's konnectivity-client and
// k8s.io/apiserver the building module pins (see ../../go.mod and
// ../../latest/go.mod). It is the client side of interop/run.sh's matrix.
//
//	konnectivity-peer version
//	    JSON: the linked konnectivity-client, k8s.io/apiserver and grpc versions.
//	konnectivity-peer client  (--uds PATH | --tcp HOST:PORT --ca F --cert F --key F) --case C --address A ...
//	    The Go konnectivity-client (CreateSingleUseGrpcTunnelWithContext, configured like
//	    kube-apiserver: WithBlock, WithReturnConnectionError) over the gRPC frontend.
//	konnectivity-peer egress  --config FILE --case C --address A ...
//	    kube-apiserver's own dialer: k8s.io/apiserver/pkg/server/egressselector loads and
//	    validates an EgressSelectorConfiguration and returns the `cluster` dialer.
//
// Cases (client and egress unless noted):
//
//	echo          write --bytes of a pattern in --chunk writes to a TCP echo target, read them back,
//	              compare byte for byte; with --hold D, pause D halfway (prints HOLD on stderr)
//	upload        POST --bytes to the target's /sink; the target's byte count and SHA-256 must match
//	download      GET /bytes/N (N = --bytes); length and content must match
//	get           GET --path; status must be 200
//	dial-error    the dial must fail; reports the error text (and the client's failure reason,
//	              or kube-apiserver's egress dial-failure stage); --expect-reason checks it
//	close-client  (client) dial, exchange, conn.Close() must return nil (CLOSE_RSP arrived) and
//	              the tunnel must end
//	close-remote  (client) the target closes after an HTTP response (Connection: close): Read must
//	              see EOF and the tunnel must end
//	reusable      (client, konnectivity-client >= v0.37 only) one CreateGRPCTunnel, --streams
//	              concurrent dials through it (one Proxy stream each on one HTTP/2 connection),
//	              each echoing --bytes; Close must end the tunnel
//
// Prints one JSON object on stdout. Exit status 0 when the case passed, 1 when it failed, 2 on usage.
package main

import (
	"bufio"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"runtime/debug"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"k8s.io/apiserver/pkg/server/egressselector"
	"k8s.io/component-base/metrics/legacyregistry"
	"sigs.k8s.io/apiserver-network-proxy/konnectivity-client/pkg/client"
)

type result struct {
	Peer    string `json:"peer"`
	Case    string `json:"case"`
	OK      bool   `json:"ok"`
	Address string `json:"address"`
	Stage   string `json:"stage,omitempty"` // where it failed: setup, tunnel, dial, io, verify, http, close
	Error   string `json:"error,omitempty"`

	DialError string  `json:"dial_error,omitempty"` // dial-error: the error the caller saw
	Reason    string  `json:"reason,omitempty"`     // client: GetDialFailureReason; egress: failure stage
	Bytes     int64   `json:"bytes,omitempty"`
	Status    int     `json:"status,omitempty"`
	MiBPerSec float64 `json:"mib_per_s,omitempty"`
	ElapsedMs float64 `json:"elapsed_ms"`
}

type opts struct {
	peer       string
	uds, tcp   string
	ca, cert   string
	key        string
	config     string
	kase       string
	address    string
	path       string
	bytes      int64
	chunk      int
	hold       time.Duration
	wantReason string
	timeout    time.Duration
	streams    int
}

// reusableCase runs the reusable case; reusable.go sets it where the client has the API.
var reusableCase func(ctx context.Context, o *opts, res *result) error

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	switch os.Args[1] {
	case "version":
		out, _ := json.Marshal(versions())
		fmt.Println(string(out))
		return
	case "client", "egress":
	default:
		usage()
	}
	o := &opts{peer: os.Args[1]}
	fs := flag.NewFlagSet(o.peer, flag.ExitOnError)
	fs.StringVar(&o.uds, "uds", "", "client: gRPC frontend Unix socket")
	fs.StringVar(&o.tcp, "tcp", "", "client: gRPC frontend host:port (mTLS; needs --ca, --cert, --key)")
	fs.StringVar(&o.ca, "ca", "", "client: CA bundle of the frontend's server certificate")
	fs.StringVar(&o.cert, "cert", "", "client: client certificate")
	fs.StringVar(&o.key, "key", "", "client: client key")
	fs.StringVar(&o.config, "config", "", "egress: EgressSelectorConfiguration file")
	fs.StringVar(&o.kase, "case", "echo", "echo | upload | download | get | dial-error | close-client | close-remote | reusable")
	fs.StringVar(&o.address, "address", "", "host:port the agent dials")
	fs.StringVar(&o.path, "path", "/", "get: request path")
	fs.Int64Var(&o.bytes, "bytes", 1<<20, "echo, upload, download: bytes to transfer")
	fs.IntVar(&o.chunk, "chunk", 32<<10, "echo, upload: bytes per Write (one DATA packet each on gRPC)")
	fs.DurationVar(&o.hold, "hold", 0, "echo: pause this long halfway")
	fs.StringVar(&o.wantReason, "expect-reason", "", "dial-error: required failure reason (client) or stage (egress)")
	fs.DurationVar(&o.timeout, "timeout", 60*time.Second, "deadline for the whole case")
	fs.IntVar(&o.streams, "streams", 16, "reusable: concurrent dials through one tunnel")
	fs.Parse(os.Args[2:])
	if o.address == "" || o.chunk <= 0 || o.bytes < 0 ||
		(o.peer == "client" && (o.uds == "") == (o.tcp == "")) ||
		(o.peer == "egress" && o.config == "") {
		fmt.Fprintln(os.Stderr, "konnectivity-peer: bad arguments")
		fs.Usage()
		os.Exit(2)
	}

	res := &result{Peer: o.peer, Case: o.kase, Address: o.address}
	ctx, cancel := context.WithTimeout(context.Background(), o.timeout)
	defer cancel()
	start := time.Now()
	done := make(chan struct{})
	// The client's net.Conn ignores deadlines: run the case aside and enforce the deadline here.
	go func() {
		defer close(done)
		if err := run(ctx, o, res); err != nil && res.Error == "" {
			res.Error = err.Error()
		}
	}()
	select {
	case <-done:
	case <-time.After(o.timeout + 15*time.Second): // Close may wait 10 s for CLOSE_RSP
		res = &result{Peer: o.peer, Case: o.kase, Address: o.address, Stage: "timeout",
			Error: fmt.Sprintf("no result within %v", o.timeout+15*time.Second)}
	}
	res.ElapsedMs = float64(time.Since(start).Microseconds()) / 1000
	out, _ := json.Marshal(res)
	fmt.Println(string(out))
	if !res.OK {
		os.Exit(1)
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: konnectivity-peer version | client ... | egress ...  (see the source's doc comment)")
	os.Exit(2)
}

func versions() map[string]string {
	v := map[string]string{}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return v
	}
	v["go"] = bi.GoVersion
	if reusableCase != nil {
		v["reusable-tunnel"] = "yes"
	}
	for _, d := range bi.Deps {
		switch d.Path {
		case "sigs.k8s.io/apiserver-network-proxy/konnectivity-client":
			v["konnectivity-client"] = d.Version
		case "k8s.io/apiserver":
			v["k8s.io/apiserver"] = d.Version
		case "google.golang.org/grpc":
			v["grpc"] = d.Version
		}
	}
	return v
}

// dialer returns how this peer opens one connection to addr through the proxy.
type dialFunc func(ctx context.Context, addr string) (net.Conn, error)

func run(ctx context.Context, o *opts, res *result) error {
	var dial dialFunc
	switch o.peer {
	case "client":
		var err error
		if dial, err = clientDialer(o, res); err != nil {
			res.Stage = "setup"
			return err
		}
	case "egress":
		var err error
		if dial, err = egressDialer(o.config); err != nil {
			res.Stage = "setup"
			return err
		}
	}
	switch o.kase {
	case "echo":
		return runEcho(ctx, o, res, dial)
	case "upload":
		return runUpload(ctx, o, res, dial)
	case "download":
		return runHTTP(ctx, o, res, dial, fmt.Sprintf("/bytes/%d", o.bytes), o.bytes)
	case "get":
		return runHTTP(ctx, o, res, dial, o.path, -1)
	case "dial-error":
		return runDialError(ctx, o, res, dial)
	case "reusable":
		if o.peer != "client" || reusableCase == nil {
			return fmt.Errorf("case reusable needs the client peer built with konnectivity-client >= v0.37 (-tags reusable)")
		}
		return reusableCase(ctx, o, res)
	case "close-client", "close-remote":
		if o.peer != "client" {
			return fmt.Errorf("case %s is for the client peer", o.kase)
		}
		return runClose(ctx, o, res)
	}
	return fmt.Errorf("unknown case %q", o.kase)
}

// ---- the Go konnectivity-client ----

func grpcOptions(o *opts) ([]grpc.DialOption, string, error) {
	base := []grpc.DialOption{grpc.WithBlock(), grpc.WithReturnConnectionError()}
	if o.uds != "" {
		uds := o.uds
		return append(base,
			grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
				var d net.Dialer
				return d.DialContext(ctx, "unix", uds)
			}),
			grpc.WithTransportCredentials(insecure.NewCredentials())), uds, nil
	}
	tlsConfig, err := clientTLS(o.ca, o.cert, o.key)
	if err != nil {
		return nil, "", err
	}
	return append(base, grpc.WithTransportCredentials(credentials.NewTLS(tlsConfig))), o.tcp, nil
}

func clientTLS(ca, cert, key string) (*tls.Config, error) {
	pair, err := tls.LoadX509KeyPair(cert, key)
	if err != nil {
		return nil, err
	}
	pem, err := os.ReadFile(ca)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, errors.New("no certificate in " + ca)
	}
	return &tls.Config{Certificates: []tls.Certificate{pair}, RootCAs: pool, MinVersion: tls.VersionTLS12}, nil
}

func clientDialer(o *opts, res *result) (dialFunc, error) {
	dialOpts, target, err := grpcOptions(o)
	if err != nil {
		return nil, err
	}
	return func(ctx context.Context, addr string) (net.Conn, error) {
		tunnel, err := client.CreateSingleUseGrpcTunnelWithContext(ctx, ctx, target, dialOpts...)
		if err != nil {
			res.Stage = "tunnel"
			return nil, err
		}
		conn, err := tunnel.DialContext(ctx, "tcp", addr)
		if err != nil {
			res.Stage = "dial"
			if _, reason := client.GetDialFailureReason(err); reason != "" {
				res.Reason = string(reason)
			}
			return nil, err
		}
		return conn, nil
	}, nil
}

// ---- kube-apiserver's egress selector ----

func egressDialer(path string) (dialFunc, error) {
	config, err := egressselector.ReadEgressSelectorConfiguration(path)
	if err != nil {
		return nil, err
	}
	if errs := egressselector.ValidateEgressSelectorConfiguration(config); len(errs) > 0 {
		return nil, errs.ToAggregate()
	}
	selector, err := egressselector.NewEgressSelector(config)
	if err != nil {
		return nil, err
	}
	dial, err := selector.Lookup(egressselector.Cluster.AsNetworkContext())
	if err != nil {
		return nil, err
	}
	if dial == nil {
		return nil, errors.New("no dialer for the cluster network context")
	}
	return func(ctx context.Context, addr string) (net.Conn, error) {
		return dial(ctx, "tcp", addr)
	}, nil
}

// egressFailureStage reads kube-apiserver's apiserver_egress_dialer_dial_failure_count.
func egressFailureStage() string {
	families, err := legacyregistry.DefaultGatherer.Gather()
	if err != nil {
		return ""
	}
	var stages []string
	for _, f := range families {
		if f.GetName() != "apiserver_egress_dialer_dial_failure_count" {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "stage" && m.GetCounter().GetValue() > 0 {
					stages = append(stages, l.GetValue())
				}
			}
		}
	}
	return strings.Join(stages, ",")
}

// ---- cases ----

func pattern(i int64) byte { return byte((i*7 + i/251) % 251) }

func fill(buf []byte, off int64) {
	for j := range buf {
		buf[j] = pattern(off + int64(j))
	}
}

func runEcho(ctx context.Context, o *opts, res *result, dial dialFunc) error {
	conn, err := dial(ctx, o.address)
	if err != nil {
		return err
	}
	defer conn.Close()
	start := time.Now()
	half := o.bytes / 2
	if o.hold == 0 {
		half = o.bytes
	}
	if err := echoRange(conn, res, 0, half, o.chunk); err != nil {
		return err
	}
	if o.hold > 0 {
		fmt.Fprintln(os.Stderr, "HOLD")
		time.Sleep(o.hold)
		if err := echoRange(conn, res, half, o.bytes, o.chunk); err != nil {
			return err
		}
	}
	res.Bytes, res.OK = o.bytes, true
	res.MiBPerSec = mibps(o.bytes, time.Since(start))
	return nil
}

// echoRange writes pattern bytes [from, to) and reads the same bytes back.
func echoRange(conn net.Conn, res *result, from, to int64, chunk int) error {
	writeErr := make(chan error, 1)
	go func() {
		buf := make([]byte, chunk)
		for off := from; off < to; {
			k := min(int64(len(buf)), to-off)
			fill(buf[:k], off)
			if _, err := conn.Write(buf[:k]); err != nil {
				writeErr <- err
				return
			}
			off += k
		}
		writeErr <- nil
	}()
	buf := make([]byte, 64<<10)
	for got := from; got < to; {
		k, err := conn.Read(buf[:min(int64(len(buf)), to-got)])
		for j := 0; j < k; j++ {
			if at := got + int64(j); buf[j] != pattern(at) {
				res.Stage, res.Bytes = "verify", at
				return fmt.Errorf("byte %d: got %#x want %#x", at, buf[j], pattern(at))
			}
		}
		got += int64(k)
		if err != nil {
			res.Stage, res.Bytes = "io", got
			return fmt.Errorf("read after %d of %d bytes: %v", got, to, err)
		}
	}
	if err := <-writeErr; err != nil {
		res.Stage = "io"
		return fmt.Errorf("write: %v", err)
	}
	return nil
}

// patternReader yields n pattern bytes in reads of at most chunk bytes (one DATA packet each).
type patternReader struct {
	off, n int64
	chunk  int
	sum    io.Writer
}

func (r *patternReader) Read(p []byte) (int, error) {
	if r.off >= r.n {
		return 0, io.EOF
	}
	k := min(int64(len(p)), int64(r.chunk), r.n-r.off)
	fill(p[:k], r.off)
	r.sum.Write(p[:k])
	r.off += k
	return int(k), nil
}

func transport(dial dialFunc) *http.Transport {
	return &http.Transport{
		DialContext:       func(ctx context.Context, _, addr string) (net.Conn, error) { return dial(ctx, addr) },
		DisableKeepAlives: true,
	}
}

func runUpload(ctx context.Context, o *opts, res *result, dial dialFunc) error {
	tr := transport(dial)
	defer tr.CloseIdleConnections()
	sum := sha256.New()
	body := &patternReader{n: o.bytes, chunk: o.chunk, sum: sum}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+o.address+"/sink", body)
	if err != nil {
		return err
	}
	req.ContentLength = o.bytes
	start := time.Now()
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		if res.Stage == "" {
			res.Stage = "http"
		}
		return err
	}
	defer resp.Body.Close()
	reply, err := io.ReadAll(resp.Body)
	res.Status = resp.StatusCode
	if err != nil || resp.StatusCode != 200 {
		res.Stage = "http"
		return fmt.Errorf("status %d, body %q, err %v", resp.StatusCode, reply, err)
	}
	want := fmt.Sprintf("%d %s", o.bytes, hex.EncodeToString(sum.Sum(nil)))
	if got := strings.TrimSpace(string(reply)); got != want {
		res.Stage = "verify"
		return fmt.Errorf("target received %q, sent %q", got, want)
	}
	res.Bytes, res.OK = o.bytes, true
	res.MiBPerSec = mibps(o.bytes, time.Since(start))
	return nil
}

// runHTTP GETs path; with want >= 0 the body must be want bytes of test-target's /bytes pattern.
func runHTTP(ctx context.Context, o *opts, res *result, dial dialFunc, path string, want int64) error {
	tr := transport(dial)
	defer tr.CloseIdleConnections()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+o.address+path, nil)
	if err != nil {
		return err
	}
	start := time.Now()
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		if res.Stage == "" {
			res.Stage = "http"
		}
		return err
	}
	defer resp.Body.Close()
	res.Status = resp.StatusCode
	const alphabet = "0123456789abcdef"
	buf := make([]byte, 64<<10)
	var n int64
	for {
		k, err := resp.Body.Read(buf)
		if want >= 0 {
			for j := 0; j < k; j++ {
				if buf[j] != alphabet[(n+int64(j))%16] {
					res.Stage = "verify"
					return fmt.Errorf("body byte %d differs", n+int64(j))
				}
			}
		}
		n += int64(k)
		if err == io.EOF {
			break
		}
		if err != nil {
			res.Stage, res.Bytes = "io", n
			return fmt.Errorf("reading body after %d bytes: %v", n, err)
		}
	}
	res.Bytes = n
	if resp.StatusCode != 200 {
		res.Stage = "http"
		return fmt.Errorf("status %d", resp.StatusCode)
	}
	if want >= 0 && n != want {
		res.Stage = "verify"
		return fmt.Errorf("body has %d bytes, want %d", n, want)
	}
	res.OK = true
	res.MiBPerSec = mibps(n, time.Since(start))
	return nil
}

func runDialError(ctx context.Context, o *opts, res *result, dial dialFunc) error {
	conn, err := dial(ctx, o.address)
	if err == nil {
		conn.Close()
		res.Stage = "dial"
		return errors.New("dial unexpectedly succeeded")
	}
	if o.peer == "client" && res.Stage != "dial" {
		return err // the tunnel itself failed: not the failure this case is about
	}
	res.Stage = "dial"
	res.DialError = err.Error()
	if o.peer == "egress" {
		res.Reason = egressFailureStage()
	}
	if o.wantReason != "" && res.Reason != o.wantReason {
		return fmt.Errorf("reason %q, want %q", res.Reason, o.wantReason)
	}
	res.OK = true
	return nil
}

func runClose(ctx context.Context, o *opts, res *result) error {
	dialOpts, target, err := grpcOptions(o)
	if err != nil {
		return err
	}
	tunnel, err := client.CreateSingleUseGrpcTunnelWithContext(ctx, context.Background(), target, dialOpts...)
	if err != nil {
		res.Stage = "tunnel"
		return err
	}
	conn, err := tunnel.DialContext(ctx, "tcp", o.address)
	if err != nil {
		res.Stage = "dial"
		return err
	}
	if o.kase == "close-client" {
		if err := echoRange(conn, res, 0, 4096, 1024); err != nil {
			return err
		}
		// Close sends CLOSE_REQ and returns an error unless CLOSE_RSP arrives within 10 s.
		if err := conn.Close(); err != nil {
			res.Stage = "close"
			return fmt.Errorf("conn.Close: %v", err)
		}
	} else {
		if _, err := io.WriteString(conn, "GET / HTTP/1.1\r\nHost: target\r\nConnection: close\r\n\r\n"); err != nil {
			res.Stage = "io"
			return err
		}
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			res.Stage = "http"
			return err
		}
		body, err := io.ReadAll(resp.Body) // ends at the target's close: Connection: close, no length
		res.Status = resp.StatusCode
		if err != nil || resp.StatusCode != 200 || string(body) != "ok\n" {
			res.Stage = "http"
			return fmt.Errorf("status %d body %q err %v", resp.StatusCode, body, err)
		}
		// The server closed: further reads see EOF (the agent's CLOSE_RSP), not a hang.
		if k, err := conn.Read(make([]byte, 1)); err != io.EOF {
			res.Stage = "close"
			return fmt.Errorf("read after the remote close: %d bytes, %v (want EOF)", k, err)
		}
	}
	select {
	case <-tunnel.Done():
	case <-time.After(10 * time.Second):
		res.Stage = "close"
		return errors.New("tunnel not done 10 s after the connection closed")
	}
	res.OK = true
	return nil
}

func mibps(n int64, d time.Duration) float64 {
	if d <= 0 {
		return 0
	}
	return float64(n) / (1 << 20) / d.Seconds()
}
