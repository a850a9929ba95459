// test-target is the far end for loopback interop tests: a TCP echo server
// and a small HTTP server. Both refuse to bind anything but loopback.
//
//	GET /            200 "ok\n"
//	GET /bytes/N     200 with N bytes of body (N <= 1 GiB)
//	GET /status/N    responds with status N
//	POST /sink       reads the whole body; 200 "<bytes> <sha256 hex>\n"
package main

import (
	"crypto/sha256"
	"encoding/hex"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"
)

func main() {
	echoAddr := flag.String("echo", "127.0.0.1:18100", "TCP echo listen address (loopback; empty disables)")
	httpAddr := flag.String("http", "127.0.0.1:18101", "HTTP listen address (loopback; empty disables)")
	flag.Parse()

	for _, a := range []string{*echoAddr, *httpAddr} {
		if a == "" {
			continue
		}
		host, _, err := net.SplitHostPort(a)
		if ip := net.ParseIP(host); err != nil || ip == nil || !ip.IsLoopback() {
			log.Fatalf("test-target: %q is not a loopback IP address", a)
		}
	}

	errc := make(chan error, 2)
	if *echoAddr != "" {
		ln, err := net.Listen("tcp", *echoAddr)
		if err != nil {
			log.Fatal(err)
		}
		log.Printf("test-target: echo on %s", ln.Addr())
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					errc <- err
					return
				}
				go func() { defer c.Close(); io.Copy(c, c) }()
			}
		}()
	}
	if *httpAddr != "" {
		ln, err := net.Listen("tcp", *httpAddr)
		if err != nil {
			log.Fatal(err)
		}
		log.Printf("test-target: http on %s", ln.Addr())
		srv := &http.Server{Handler: http.HandlerFunc(serveHTTP), ReadHeaderTimeout: 10 * time.Second}
		go func() { errc <- srv.Serve(ln) }()
	}
	log.Fatal(<-errc)
}

var chunk = []byte(strings.Repeat("0123456789abcdef", 4096)) // 64 KiB

func serveHTTP(w http.ResponseWriter, r *http.Request) {
	switch {
	case r.URL.Path == "/":
		io.WriteString(w, "ok\n")
	case strings.HasPrefix(r.URL.Path, "/bytes/"):
		n, err := strconv.ParseInt(strings.TrimPrefix(r.URL.Path, "/bytes/"), 10, 64)
		if err != nil || n < 0 || n > 1<<30 {
			http.Error(w, "bad size", http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Length", strconv.FormatInt(n, 10))
		for n > 0 {
			k := min(n, int64(len(chunk)))
			if _, err := w.Write(chunk[:k]); err != nil {
				return
			}
			n -= k
		}
	case r.URL.Path == "/sink" && r.Method == http.MethodPost:
		sum := sha256.New()
		n, err := io.Copy(sum, r.Body)
		if err != nil {
			http.Error(w, "reading body: "+err.Error(), http.StatusBadRequest)
			return
		}
		fmt.Fprintf(w, "%d %s\n", n, hex.EncodeToString(sum.Sum(nil)))
	case strings.HasPrefix(r.URL.Path, "/status/"):
		code, err := strconv.Atoi(strings.TrimPrefix(r.URL.Path, "/status/"))
		if err != nil || code < 200 || code > 599 {
			http.Error(w, "bad status", http.StatusBadRequest)
			return
		}
		w.WriteHeader(code)
		fmt.Fprintf(w, "status %d\n", code)
	default:
		http.NotFound(w, r)
	}
}
