package main

import (
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"
)

// logEvery prints a numbered line per tick until SIGTERM, so a follower (kubectl logs -f) can
// tell a lost or repeated line from a stream that broke.
func logEvery(args []string) error {
	if len(args) != 1 {
		return fmt.Errorf("takes one argument, the interval (like 100ms or 1s)")
	}
	every, err := time.ParseDuration(args[0])
	if err != nil || every <= 0 {
		return fmt.Errorf("interval %q: want a positive Go duration like 100ms or 1s", args[0])
	}
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	tick := time.NewTicker(every)
	defer tick.Stop()
	for n := 1; ; n++ {
		fmt.Printf("tick %d %s\n", n, time.Now().UTC().Format(time.RFC3339Nano))
		select {
		case <-stop:
			return nil
		case <-tick.C:
		}
	}
}
