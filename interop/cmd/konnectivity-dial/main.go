// konnectivity-dial opens one connection through a Konnectivity proxy server's
// gRPC frontend on a Unix socket, using the upstream Go konnectivity-client
// the way kube-apiserver does (single-use tunnel, WithBlock, insecure creds),
// and then exercises it.
//
//	--mode echo               write --bytes of a fixed pattern, read them back, compare
//	--mode get                HTTP/1.1 GET --path over the tunnel
//	--mode expect-dial-error  succeed (exit 0) only if the dial through the tunnel fails
//	                          (and, with --expect-reason R, GetDialFailureReason gives R)
//
// It prints one JSON object on stdout. Exit codes: 0 success, 1 failure, 2 usage.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"sigs.k8s.io/apiserver-network-proxy/konnectivity-client/pkg/client"
)

type result struct {
	Mode    string `json:"mode"`
	OK      bool   `json:"ok"`
	Address string `json:"address"`
	Stage   string `json:"stage,omitempty"` // where a failure happened: tunnel, dial, io, verify, http
	Error   string `json:"error,omitempty"`

	// expect-dial-error
	DialFailed    bool   `json:"dial_failed,omitempty"`
	IsDialFailure *bool  `json:"is_dial_failure,omitempty"` // client.GetDialFailureReason's first result
	Reason        string `json:"reason,omitempty"`          // client.GetDialFailureReason's reason

	// echo
	Bytes      int64   `json:"bytes,omitempty"`
	MismatchAt *int64  `json:"mismatch_at,omitempty"`
	MiBPerSec  float64 `json:"mib_per_s,omitempty"`

	// get
	Status   int   `json:"status,omitempty"`
	BodySize int64 `json:"body_bytes,omitempty"`

	TunnelMs  float64 `json:"tunnel_ms"` // gRPC connect + Proxy stream
	DialMs    float64 `json:"dial_ms"`   // DIAL_REQ -> DIAL_RSP
	ElapsedMs float64 `json:"elapsed_ms"`
}

func main() {
	uds := flag.String("uds", "", "path of the proxy server's gRPC frontend Unix socket (required)")
	address := flag.String("address", "", "host:port the agent should dial (required)")
	mode := flag.String("mode", "echo", "echo | get | expect-dial-error")
	nbytes := flag.Int64("bytes", 1<<20, "echo: number of bytes to send and expect back")
	chunk := flag.Int("chunk", 32<<10, "echo: bytes per Write (one DATA packet each)")
	path := flag.String("path", "/", "get: request path")
	timeout := flag.Duration("timeout", 30*time.Second, "overall deadline, covering tunnel setup, dial and I/O")
	wantReason := flag.String("expect-reason", "", "expect-dial-error: also require this GetDialFailureReason reason (e.g. endpoint)")
	flag.Parse()

	if *uds == "" || *address == "" || *chunk <= 0 || *nbytes < 0 {
		fmt.Fprintln(os.Stderr, "konnectivity-dial: --uds and --address are required; --chunk > 0, --bytes >= 0")
		flag.Usage()
		os.Exit(2)
	}
	switch *mode {
	case "echo", "get", "expect-dial-error":
	default:
		fmt.Fprintf(os.Stderr, "konnectivity-dial: unknown --mode %q\n", *mode)
		os.Exit(2)
	}

	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()

	res := &result{Mode: *mode, Address: *address}
	start := time.Now()

	// The net.Conn from the client ignores deadlines, so the whole run
	// happens in a goroutine and the deadline is enforced here.
	done := make(chan struct{})
	go func() {
		defer close(done)
		switch *mode {
		case "echo":
			runEcho(ctx, res, *uds, *address, *nbytes, *chunk)
		case "get":
			runGet(ctx, res, *uds, *address, *path)
		case "expect-dial-error":
			runExpectDialError(ctx, res, *uds, *address, *wantReason)
		}
	}()
	select {
	case <-done:
	case <-time.After(*timeout + 15*time.Second): // client Close may wait 10 s for CLOSE_RSP
		res = &result{Mode: *mode, Address: *address, Stage: "timeout",
			Error: fmt.Sprintf("no result within %v", *timeout+15*time.Second)}
	}
	res.ElapsedMs = ms(time.Since(start))

	out, _ := json.Marshal(res)
	fmt.Println(string(out))
	if !res.OK {
		os.Exit(1)
	}
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// newTunnel creates a single-use tunnel over the UDS frontend, configured like
// kube-apiserver's GRPC/UDS egress dialer. The tunnel lives as long as ctx.
func newTunnel(ctx context.Context, uds string) (client.Tunnel, error) {
	dialUDS := func(ctx context.Context, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", uds)
	}
	return client.CreateSingleUseGrpcTunnelWithContext(ctx, ctx, uds,
		grpc.WithContextDialer(dialUDS),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithBlock(),
		grpc.WithReturnConnectionError(),
	)
}

// dial creates a tunnel and dials address through it, recording timings.
// On failure it fills res.Stage/Error and returns nil.
func dial(ctx context.Context, res *result, uds, address string) (net.Conn, error) {
	t0 := time.Now()
	tunnel, err := newTunnel(ctx, uds)
	res.TunnelMs = ms(time.Since(t0))
	if err != nil {
		res.Stage, res.Error = "tunnel", err.Error()
		return nil, err
	}
	t1 := time.Now()
	conn, err := tunnel.DialContext(ctx, "tcp", address)
	res.DialMs = ms(time.Since(t1))
	if err != nil {
		res.Stage, res.Error = "dial", err.Error()
		isDF, reason := client.GetDialFailureReason(err)
		res.IsDialFailure, res.Reason = &isDF, string(reason)
		return nil, err
	}
	return conn, nil
}

func pattern(i int64) byte { return byte((i*7 + i/251) % 251) }

func runEcho(ctx context.Context, res *result, uds, address string, n int64, chunk int) {
	conn, err := dial(ctx, res, uds, address)
	if err != nil {
		return
	}
	defer conn.Close()

	start := time.Now()
	writeErr := make(chan error, 1)
	go func() {
		buf := make([]byte, chunk)
		for off := int64(0); off < n; {
			k := int64(len(buf))
			if n-off < k {
				k = n - off
			}
			for j := int64(0); j < k; j++ {
				buf[j] = pattern(off + j)
			}
			if _, err := conn.Write(buf[:k]); err != nil {
				writeErr <- err
				return
			}
			off += k
		}
		writeErr <- nil
	}()

	buf := make([]byte, 64<<10)
	var got int64
	for got < n {
		k, err := conn.Read(buf)
		for j := 0; j < k; j++ {
			if buf[j] != pattern(got+int64(j)) {
				at := got + int64(j)
				res.MismatchAt, res.Bytes = &at, got+int64(j)
				res.Stage, res.Error = "verify", fmt.Sprintf("byte %d: got %#x want %#x", at, buf[j], pattern(at))
				return
			}
		}
		got += int64(k)
		if err != nil {
			res.Bytes = got
			res.Stage, res.Error = "io", fmt.Sprintf("read after %d of %d bytes: %v", got, n, err)
			return
		}
	}
	if err := <-writeErr; err != nil {
		res.Stage, res.Error = "io", "write: "+err.Error()
		return
	}
	el := time.Since(start)
	res.Bytes, res.OK = got, true
	if el > 0 {
		res.MiBPerSec = float64(n) / (1 << 20) / el.Seconds()
	}
}

func runGet(ctx context.Context, res *result, uds, address, path string) {
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, addr string) (net.Conn, error) {
			return dial(ctx, res, uds, addr)
		},
		DisableKeepAlives: true,
	}
	defer tr.CloseIdleConnections()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+address+path, nil)
	if err != nil {
		res.Stage, res.Error = "http", err.Error()
		return
	}
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		if res.Stage == "" {
			res.Stage, res.Error = "http", err.Error()
		}
		return
	}
	defer resp.Body.Close()
	res.Status = resp.StatusCode
	res.BodySize, err = io.Copy(io.Discard, resp.Body)
	if err != nil {
		res.Stage, res.Error = "http", "reading body: "+err.Error()
		return
	}
	res.OK = true
}

func runExpectDialError(ctx context.Context, res *result, uds, address, wantReason string) {
	conn, err := dial(ctx, res, uds, address)
	if err == nil {
		conn.Close()
		res.Stage, res.Error = "dial", "dial unexpectedly succeeded"
		return
	}
	if res.Stage != "dial" { // tunnel setup failed: not the failure we are looking for
		return
	}
	// Stage "dial" and Error/Reason stay set: they are the point of this mode.
	res.DialFailed = true
	res.OK = wantReason == "" || wantReason == res.Reason
}
