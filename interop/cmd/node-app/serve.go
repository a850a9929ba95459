package main

import (
	"context"
	"errors"
	"fmt"
	"log"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"
)

// serve answers HTTP on $PORT until SIGTERM, logging one line at start and one per request so
// that kubectl logs has something to show for each flow.
func serve(args []string) error {
	if len(args) != 0 {
		return errors.New("takes no arguments (the port comes from $PORT)")
	}
	port := os.Getenv("PORT")
	if port == "" {
		port = "8080"
	}
	host, _ := os.Hostname()
	logger := log.New(os.Stdout, "", log.LstdFlags|log.Lmicroseconds)
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "hello from node-app on %s\n", host)
	})
	logged := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		logger.Printf("request %s %s from %s", r.Method, r.URL.Path, r.RemoteAddr)
		mux.ServeHTTP(w, r)
	})
	srv := &http.Server{Addr: ":" + port, Handler: logged, ReadHeaderTimeout: 10 * time.Second}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	done := make(chan error, 1)
	go func() { done <- srv.ListenAndServe() }()
	logger.Printf("node-app serving on :%s as %s", port, host)
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
	}
	shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	logger.Printf("node-app stopping")
	return srv.Shutdown(shutdown)
}
