package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"
)

// sidecarValues put the server in kube-apiserver's own Pod (server.kind=sidecar).
var sidecarValues = []string{"--set", "server.kind=sidecar"}

// installTetherSidecar installs tether as the book's sidecar variant: helm install, then the
// node document (a strategic-merge patch rendered with nodeManifests=true) applied to
// kube-apiserver's static Pod with `kubectl patch --local`, as the patch's own comment says.
// The node already passes --egress-selector-config-file, the one step a patch cannot do.
func (e *env) installTetherSidecar(ctx context.Context) error {
	if err := e.prepareServerFiles(ctx, nonroot); err != nil {
		return err
	}
	original, err := os.ReadFile(e.node(apiserverManifest))
	if err != nil {
		return err
	}
	e.apiserverOriginal = original
	if err := e.helmStep("install", sidecarValues...)(ctx); err != nil {
		return err
	}
	args := append(append([]string{"template", "tether", e.chart, "-n", "kube-system", "--set", "nodeManifests=true"},
		e.helmValues()...), sidecarValues...)
	patch, err := e.helmCmd(ctx, time.Minute, args...)
	if err != nil {
		return err
	}
	patchFile := e.work + "/sidecar-patch.yaml"
	if err := os.WriteFile(patchFile, []byte(patch), 0o600); err != nil {
		return err
	}
	r := e.kube.Cmd(ctx, 30*time.Second, "patch", "--local", "--type=strategic", "-o", "yaml",
		"-f", e.node(apiserverManifest), "--patch-file="+patchFile).Run()
	if r.Err != nil {
		return fmt.Errorf("kubectl patch --local kube-apiserver.yaml: %v: %s", r.Err, strings.TrimSpace(r.Stderr))
	}
	if err := e.replaceAPIServer(ctx, []byte(r.Stdout)); err != nil {
		return err
	}
	return seq(e.rolledOut("tether-agent"), e.agentsConnected(1))(ctx)
}

// uninstallTetherSidecar puts kube-apiserver's manifest back as it was, then uninstalls.
func (e *env) uninstallTetherSidecar(ctx context.Context) error {
	return errors.Join(e.restoreAPIServer(ctx), e.uninstallTether(ctx))
}
