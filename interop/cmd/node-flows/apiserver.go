package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"
)

// kube-apiserver's static Pod, which the sidecar and hosted variants change: node.sh wrote it,
// the kubelet restarts the Pod when it changes.
const apiserverManifest = "manifests/kube-apiserver.yaml"

func (e *env) apiserverMirrorPod() string { return "kube-apiserver-" + e.nodeName }

// apiserverHash is the kubelet's hash of kube-apiserver's manifest in force, "" when it cannot
// be read (kube-apiserver is down).
func (e *env) apiserverHash(ctx context.Context) string {
	r := e.kube.Cmd(ctx, 5*time.Second, "get", "pod", "-n", "kube-system", e.apiserverMirrorPod(), "--ignore-not-found",
		"-o", `jsonpath={.metadata.annotations.kubernetes\.io/config\.hash}`).Run()
	return strings.TrimSpace(r.Stdout)
}

// replaceAPIServer writes manifest over kube-apiserver's static Pod, the way node.sh does
// (beside it under a dot name, which the kubelet skips, then renamed into place), and waits
// until the kubelet runs the new one and every container of it is Ready. kube-apiserver is
// down in between: ~35 s with kubeadm's 30 s grace period.
func (e *env) replaceAPIServer(ctx context.Context, manifest []byte) error {
	old := e.apiserverHash(ctx)
	if old == "" {
		return errors.New("kube-apiserver's mirror Pod has no config hash: is it running?")
	}
	tmp := e.node("manifests/.kube-apiserver.yaml.flows")
	if err := os.WriteFile(tmp, manifest, 0o600); err != nil {
		return err
	}
	if err := os.Rename(tmp, e.node(apiserverManifest)); err != nil {
		return err
	}
	return waitFor(ctx, "kube-apiserver restarted from its new manifest, every container Ready", 3*time.Minute, func() error {
		r := e.kube.Cmd(ctx, 5*time.Second, "get", "pod", "-n", "kube-system", e.apiserverMirrorPod(), "-o",
			`jsonpath={.metadata.annotations.kubernetes\.io/config\.hash} {.status.conditions[?(@.type=="Ready")].status}`).Run()
		got := strings.Fields(r.Stdout)
		if r.Err != nil || len(got) != 2 || got[0] == old || got[1] != "True" {
			return fmt.Errorf("config hash, Ready: %q (old hash %s) %s", strings.TrimSpace(r.Stdout), old, lastLines(r.Stderr, 1))
		}
		return nil
	})
}
