package main

import (
	"crypto/tls"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"tether.dev/interop/internal/metrics"
)

var (
	portMu   sync.Mutex
	usedPort = map[int]bool{}
)

// freePort picks a TCP port in 20000-31999 that is free on every given loopback IP: below
// Linux's ephemeral range, so no outgoing connection takes it meanwhile.
func freePort(ips ...string) int {
	if len(ips) == 0 {
		ips = []string{"127.0.0.1"}
	}
	portMu.Lock()
	defer portMu.Unlock()
	for range 10000 {
		p := 20000 + rand.IntN(12000)
		if usedPort[p] {
			continue
		}
		free := true
		for _, ip := range ips {
			ln, err := net.Listen("tcp", net.JoinHostPort(ip, strconv.Itoa(p)))
			if err != nil {
				free = false
				break
			}
			ln.Close()
		}
		if free {
			usedPort[p] = true
			return p
		}
	}
	panic("freePort: no free port in 20000-31999")
}

var httpClient = &http.Client{Timeout: 3 * time.Second, Transport: &http.Transport{
	// Only for health probes of loopback processes with throwaway certificates (kwok's own).
	TLSClientConfig: &tls.Config{InsecureSkipVerify: true},
}}

func httpGet(url string) (int, string, error) {
	resp, err := httpClient.Get(url)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	return resp.StatusCode, string(b), err
}

// waitStatus polls url until it answers want, for at most d.
func waitStatus(url string, want int, d time.Duration) error {
	return waitStatusWhile(url, want, d, nil)
}

// waitStatusWhile is waitStatus for the url of a process p that serves it, if p is not nil:
// it gives up as soon as p has exited.
func waitStatusWhile(url string, want int, d time.Duration, p *proc) error {
	deadline := time.Now().Add(d)
	var last int
	var err error
	for time.Now().Before(deadline) {
		if last, _, err = httpGet(url); last == want {
			return nil
		}
		if p != nil && p.exited() {
			return fmt.Errorf("%s: %s exited (last status %d, %v)", url, p.name, last, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("%s: status %d (%v) after %v, want %d", url, last, err, d, want)
}

// metricSum adds up every sample of name whose labels include all of want (`k="v"` pairs) on a
// Prometheus text page. metrics.ErrMissing when no sample matches.
func metricSum(url, name string, want ...string) (float64, error) {
	resp, err := httpClient.Get(url)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	return metrics.Sum(resp.Body, name, want...)
}

// metricSumText is metricSum on a page already read.
func metricSumText(page, name string, want ...string) (float64, error) {
	return metrics.Sum(strings.NewReader(page), name, want...)
}

// waitMetricAtLeast polls until the sum of name{want} reaches min, for at most d.
func waitMetricAtLeast(url, name string, min float64, d time.Duration, want ...string) (float64, error) {
	deadline := time.Now().Add(d)
	var v float64
	var err error
	for {
		v, err = metricSum(url, name, want...)
		if err == metrics.ErrMissing {
			v, err = 0, nil
		}
		if err == nil && v >= min {
			return v, nil
		}
		if time.Now().After(deadline) {
			return v, fmt.Errorf("%s%v = %v (err %v) after %v, want >= %v", name, want, v, err, d, min)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// waitMetricAtMost polls until the sum of name{want} is at most max, for at most d.
func waitMetricAtMost(url, name string, max float64, d time.Duration, want ...string) error {
	deadline := time.Now().Add(d)
	for {
		v, err := metricSum(url, name, want...)
		if err == nil && v <= max {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s%v = %v (err %v) after %v, want <= %v", name, want, v, err, d, max)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
