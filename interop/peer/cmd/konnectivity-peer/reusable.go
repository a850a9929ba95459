//go:build reusable

// The ReusableTunnel API (client.CreateGRPCTunnel: one gRPC connection, one Proxy stream per
// dial) exists from konnectivity-client v0.37; build.sh sets the tag for peer/latest only.

package main

import (
	"context"
	"fmt"
	"sync"
	"time"

	"sigs.k8s.io/apiserver-network-proxy/konnectivity-client/pkg/client"
)

func init() { reusableCase = runReusable }

// runReusable opens one reusable tunnel and dials --streams connections through it at once,
// each echoing --bytes byte for byte; then Close must end the tunnel.
func runReusable(ctx context.Context, o *opts, res *result) error {
	dialOpts, target, err := grpcOptions(o)
	if err != nil {
		return err
	}
	tunnel, err := client.CreateGRPCTunnel(ctx, target, dialOpts...)
	if err != nil {
		res.Stage = "tunnel"
		return err
	}
	start := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, o.streams)
	for i := 0; i < o.streams; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			conn, err := tunnel.DialContext(ctx, "tcp", o.address)
			if err != nil {
				errs <- fmt.Errorf("stream %d: dial: %v", i, err)
				return
			}
			defer conn.Close()
			var r result
			if err := echoRange(conn, &r, 0, o.bytes, o.chunk); err != nil {
				errs <- fmt.Errorf("stream %d: %s: %v", i, r.Stage, err)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		res.Stage = "io"
		tunnel.Close()
		return err
	}
	if err := tunnel.Close(); err != nil {
		res.Stage = "close"
		return fmt.Errorf("tunnel.Close: %v", err)
	}
	select {
	case <-tunnel.Done():
	default:
		res.Stage = "close"
		return fmt.Errorf("tunnel not done after Close")
	}
	res.Bytes, res.OK = o.bytes*int64(o.streams), true
	res.MiBPerSec = mibps(res.Bytes, time.Since(start))
	return nil
}
