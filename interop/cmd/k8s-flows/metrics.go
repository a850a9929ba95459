package main

import (
	"bufio"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
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
	deadline := time.Now().Add(d)
	var last int
	var err error
	for time.Now().Before(deadline) {
		if last, _, err = httpGet(url); last == want {
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("%s: status %d (%v) after %v, want %d", url, last, err, d, want)
}

var errMissing = errors.New("no such sample")

// metricSum adds up every sample of name whose labels include all of want (`k="v"` pairs) on a
// Prometheus text page. errMissing when no sample matches.
func metricSum(url, name string, want ...string) (float64, error) {
	resp, err := httpClient.Get(url)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	return metricSumFrom(resp.Body, name, want...)
}

// metricSumText is metricSum on a page already read.
func metricSumText(page, name string, want ...string) (float64, error) {
	return metricSumFrom(strings.NewReader(page), name, want...)
}

func metricSumFrom(page io.Reader, name string, want ...string) (float64, error) {
	sc := bufio.NewScanner(page)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	var sum float64
	found := false
	for sc.Scan() {
		line := sc.Text()
		rest, ok := strings.CutPrefix(line, name)
		if !ok || (rest != "" && rest[0] != ' ' && rest[0] != '{') {
			continue
		}
		labels := ""
		if strings.HasPrefix(rest, "{") {
			end := strings.Index(rest, "}")
			if end < 0 {
				continue
			}
			labels, rest = rest[1:end], rest[end+1:]
		}
		match := true
		for _, w := range want {
			if !strings.Contains(","+labels+",", ","+w+",") {
				match = false
			}
		}
		if !match {
			continue
		}
		fields := strings.Fields(rest)
		if len(fields) == 0 {
			continue
		}
		v, err := strconv.ParseFloat(fields[0], 64)
		if err != nil {
			return 0, fmt.Errorf("%s: %q: %v", name, line, err)
		}
		sum += v
		found = true
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	if !found {
		return 0, errMissing
	}
	return sum, nil
}

// waitMetricAtLeast polls until the sum of name{want} reaches min, for at most d.
func waitMetricAtLeast(url, name string, min float64, d time.Duration, want ...string) (float64, error) {
	deadline := time.Now().Add(d)
	var v float64
	var err error
	for {
		v, err = metricSum(url, name, want...)
		if err == errMissing {
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
