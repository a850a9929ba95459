// node-flows drives kubectl through a Konnectivity proxy installed on the real node
// (interop/node) the way operators install it, and checks that the flows work on real pods:
// tether installed with its Helm chart (the server as a static Pod, agents as a DaemonSet with
// projected ServiceAccount tokens), and, as the reference row, upstream's images installed as
// the kubernetes.io task "Set up Konnectivity service" describes. It runs inside the node's
// network namespace (interop/node/flows.sh starts it with `node.sh run`), rewrites the
// real-node block of COMPATIBILITY.md and exits non-zero when a check fails.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"tether.dev/interop/internal/kubectl"
)

// env is what every step needs: the node's paths, the tools, the images and the rows so far.
type env struct {
	etcK8s   string // the node's /etc/kubernetes, as seen from here
	helm     string
	chart    string
	work     string
	pkiLib   string // interop/node/lib/pki.sh: the node's openssl steps
	kube     kubectl.Runner
	images   images
	nodeName string
	nodeIP   string
	// serverPods selects the proxy servers' pods when they are not on the node's network (a
	// Deployment); empty: one server with hostNetwork, whose metrics are on loopback.
	serverPods string
	// apiserverOriginal and egressOriginal are kube-apiserver's manifest and egress selector
	// configuration before a variant changed them, to put back.
	apiserverOriginal, egressOriginal []byte
	// webhookCA is the CA of the webhook pod's serving certificate, once the workloads run.
	webhookCA string
	rows      []*row
	// loadRuns are the runs of steps under load (the migration runbook, day 2), when they ran.
	loadRuns []loadRun
}

type images struct {
	tether, upstreamServer, upstreamAgent, app string
}

func main() {
	var e env
	var out, only string
	var check bool
	flag.StringVar(&e.etcK8s, "etc-kubernetes", "", "the node's /etc/kubernetes (node.sh status prints it)")
	flag.StringVar(&e.helm, "helm", "", "helm binary")
	flag.StringVar(&e.chart, "chart", "", "tether's chart (deploy/helm/tether)")
	flag.StringVar(&e.work, "work", "", "scratch directory")
	flag.StringVar(&e.pkiLib, "pki-lib", "", "interop/node/lib/pki.sh")
	flag.StringVar(&e.images.tether, "tether-image", "", "tether's image reference, imported into the node")
	flag.StringVar(&e.images.upstreamServer, "upstream-server-image", "", "upstream's proxy-server image")
	flag.StringVar(&e.images.upstreamAgent, "upstream-agent-image", "", "upstream's proxy-agent image")
	flag.StringVar(&e.images.app, "app-image", "", "the test workload's image (node-app)")
	flag.StringVar(&e.nodeName, "node-name", "tether-node", "the node's name")
	flag.StringVar(&e.nodeIP, "node-ip", "198.18.0.2", "the node's address (agents dial the server there)")
	flag.StringVar(&out, "out", "", "COMPATIBILITY.md to rewrite the real-node block of (empty: none)")
	flag.StringVar(&only, "only", "", "one row by name (tether, \"tether, mTLS agents\", \"tether sidecar\", \"tether hosted\", \"tether drop-in\", upstream, migration, \"day 2\"): run it and write nothing")
	flag.BoolVar(&check, "check", false, "fail when -out's committed block differs from what ran")
	flag.Parse()
	for name, v := range map[string]string{"etc-kubernetes": e.etcK8s, "helm": e.helm, "chart": e.chart, "work": e.work, "pki-lib": e.pkiLib,
		"tether-image": e.images.tether, "upstream-server-image": e.images.upstreamServer,
		"upstream-agent-image": e.images.upstreamAgent, "app-image": e.images.app} {
		if v == "" {
			fmt.Fprintf(os.Stderr, "node-flows: -%s is required\n", name)
			os.Exit(2)
		}
	}
	kubectlBin, err := exec.LookPath("kubectl")
	if err != nil {
		fmt.Fprintln(os.Stderr, "node-flows: kubectl not on PATH (run me with node.sh run):", err)
		os.Exit(2)
	}
	e.kube = kubectl.Runner{Bin: kubectlBin, Kubeconfig: filepath.Join(e.etcK8s, "admin.conf"),
		CacheDir: filepath.Join(e.work, "kubectl-cache")}

	// Every step has its own deadline; this one bounds the whole run.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, 40*time.Minute)
	defer cancel()

	for _, in := range e.installations() {
		if only == "" || only == in.name {
			e.rows = append(e.rows, e.runRow(ctx, in))
		}
	}
	for _, run := range []struct {
		name string
		run  func(context.Context) ([]stepResult, error)
	}{{"migration", e.runMigration}, {"day 2", e.runDayTwo}} {
		if only == "" || only == run.name {
			res, err := run.run(ctx)
			e.loadRuns = append(e.loadRuns, loadRun{name: run.name, steps: res, err: err})
		}
	}
	os.Exit(e.report(out, only == "", check))
}
