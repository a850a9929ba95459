// Command mkimage writes an OCI image-layout tarball from files on disk: one gzip layer, the
// image config, the manifest and, for more than one architecture, an image index. It needs no
// daemon, no registry and no base image, and it is reproducible: the same inputs give the same
// digests (fixed timestamps and owners, sorted entries, no gzip header name or time).
//
// The tarball imports with `ctr -n k8s.io images import` (named by the io.containerd.image.name
// annotation) and pushes with `skopeo copy oci-archive:FILE docker://REF` or, unpacked,
// `crane push DIR REF`.
//
//	mkimage -o OUT.tar -name REF -entrypoint /path [-user UID:GID] [-arch amd64]...
//	        [-symlink /link=target]... [-dir /path:MODE]... SRC:/dest[:MODE]...
//
// SRC may contain {arch}, replaced by each -arch (Go's names: amd64, arm64), so one call
// writes a multi-architecture image from one binary per architecture.
package main

import (
	"flag"
	"fmt"
	"os"
	"strings"
)

type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, ",") }
func (l *listFlag) Set(v string) error { *l = append(*l, v); return nil }

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintf(os.Stderr, "mkimage: %v\n", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("mkimage", flag.ContinueOnError)
	out := fs.String("o", "", "output tarball (OCI image layout)")
	name := fs.String("name", "", "image reference, e.g. registry.example/tether:0.1.0")
	entrypoint := fs.String("entrypoint", "", "absolute path of the entrypoint inside the image")
	user := fs.String("user", "", "UID:GID the image runs as (empty: root)")
	var arches, symlinks, dirs, env listFlag
	fs.Var(&arches, "arch", "target architecture (Go name; repeatable; default amd64)")
	fs.Var(&symlinks, "symlink", "/link=target symbolic link in the image (repeatable)")
	fs.Var(&dirs, "dir", "/path:MODE empty directory in the image, MODE octal (repeatable)")
	fs.Var(&env, "env", "KEY=VALUE in the image's environment (repeatable)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *out == "" || *name == "" || *entrypoint == "" {
		return fmt.Errorf("-o, -name and -entrypoint are required (see the comment at the top of main.go)")
	}
	if len(arches) == 0 {
		arches = listFlag{"amd64"}
	}
	spec := imageSpec{
		name:       *name,
		entrypoint: *entrypoint,
		user:       *user,
		env:        env,
	}
	for _, s := range symlinks {
		link, target, ok := strings.Cut(s, "=")
		if !ok || !strings.HasPrefix(link, "/") || target == "" {
			return fmt.Errorf("-symlink %q: want /link=target", s)
		}
		spec.entries = append(spec.entries, entry{path: link, symlink: target})
	}
	for _, d := range dirs {
		e, err := parsePathMode(d, 0o755)
		if err != nil {
			return fmt.Errorf("-dir %q: %v", d, err)
		}
		e.dir = true
		spec.entries = append(spec.entries, e)
	}
	for _, f := range fs.Args() {
		src, rest, ok := strings.Cut(f, ":")
		if !ok || src == "" {
			return fmt.Errorf("%q: want SRC:/dest[:MODE]", f)
		}
		e, err := parsePathMode(rest, 0o555)
		if err != nil {
			return fmt.Errorf("%q: %v", f, err)
		}
		e.source = src
		spec.entries = append(spec.entries, e)
	}
	digest, err := writeLayout(*out, spec, arches)
	if err != nil {
		return err
	}
	fmt.Printf("%s %s\n", *out, digest)
	return nil
}
