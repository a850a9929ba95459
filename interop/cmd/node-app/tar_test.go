package main

import (
	"archive/tar"
	"bytes"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// The two command lines kubectl cp runs, round trip: tar cf - /abs/path | tar -xmf - -C DIR.
func TestTarRoundTripAsKubectlCp(t *testing.T) {
	src := t.TempDir()
	must(t, os.MkdirAll(filepath.Join(src, "tree", "sub"), 0o755))
	must(t, os.WriteFile(filepath.Join(src, "tree", "a"), []byte("alpha"), 0o640))
	must(t, os.WriteFile(filepath.Join(src, "tree", "sub", "b"), []byte("beta"), 0o600))
	must(t, os.Symlink("a", filepath.Join(src, "tree", "link")))

	create, err := parseTar([]string{"cf", "-", filepath.Join(src, "tree")})
	must(t, err)
	var archive bytes.Buffer
	must(t, tarCreate(&archive, create))

	names := []string{}
	tr := tar.NewReader(bytes.NewReader(archive.Bytes()))
	for hdr, err := tr.Next(); err == nil; hdr, err = tr.Next() {
		names = append(names, hdr.Name)
	}
	prefix := strings.TrimLeft(filepath.Join(src, "tree"), "/")
	want := []string{prefix + "/", prefix + "/a", prefix + "/link", prefix + "/sub/", prefix + "/sub/b"}
	if !reflect.DeepEqual(names, want) {
		t.Fatalf("member names %q, want %q (leading / removed, as GNU tar)", names, want)
	}

	dst := t.TempDir()
	extract, err := parseTar([]string{"--no-same-permissions", "--no-same-owner", "-xmf", "-", "-C", dst})
	must(t, err)
	must(t, tarExtract(bytes.NewReader(archive.Bytes()), extract))
	got, err := os.ReadFile(filepath.Join(dst, prefix, "sub", "b"))
	if err != nil || string(got) != "beta" {
		t.Fatalf("extracted sub/b = %q, %v", got, err)
	}
	if link, err := os.Readlink(filepath.Join(dst, prefix, "link")); err != nil || link != "a" {
		t.Fatalf("extracted link -> %q, %v", link, err)
	}
}

func TestTarExtractRefusesEscapes(t *testing.T) {
	var archive bytes.Buffer
	tw := tar.NewWriter(&archive)
	must(t, tw.WriteHeader(&tar.Header{Name: "../outside", Mode: 0o644, Size: 1, Typeflag: tar.TypeReg}))
	_, err := tw.Write([]byte("x"))
	must(t, err)
	must(t, tw.Close())
	dst := t.TempDir()
	err = tarExtract(&archive, tarOptions{dir: dst})
	if err == nil || !strings.Contains(err.Error(), "outside") {
		t.Fatalf("extracting ../outside: err %v, want a refusal", err)
	}
}

func TestTarParseErrors(t *testing.T) {
	for _, args := range [][]string{{"cxf", "-"}, {"tf", "-"}, {"cf", "-"}, {"--gzip", "xf", "-"}, {"xf"}} {
		if _, err := parseTar(args); err == nil {
			t.Errorf("parseTar(%q): no error", args)
		}
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
