package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

// readTar returns a tarball's regular files by name, and every entry's name with its type.
func readTar(t *testing.T, r io.Reader) (map[string][]byte, map[string]*tar.Header) {
	t.Helper()
	files := map[string][]byte{}
	headers := map[string]*tar.Header{}
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return files, headers
		}
		if err != nil {
			t.Fatal(err)
		}
		headers[h.Name] = h
		if h.Typeflag == tar.TypeReg {
			data, err := io.ReadAll(tr)
			if err != nil {
				t.Fatal(err)
			}
			files[h.Name] = data
		}
	}
}

func blob(t *testing.T, files map[string][]byte, digest string) []byte {
	t.Helper()
	data, ok := files["blobs/sha256/"+strings.TrimPrefix(digest, "sha256:")]
	if !ok {
		t.Fatalf("blob %s missing", digest)
	}
	if got := sha256Digest(data); got != digest {
		t.Fatalf("blob %s has digest %s", digest, got)
	}
	return data
}

type index struct {
	Manifests []descriptor `json:"manifests"`
}

func build(t *testing.T, dir string, extra ...string) (string, map[string][]byte) {
	t.Helper()
	out := filepath.Join(dir, "image.tar")
	args := append([]string{"-o", out, "-name", "registry.example/team/tether:0.1.0",
		"-entrypoint", "/tether", "-user", "65532:65532",
		"-symlink", "/proxy-server=tether", "-dir", "/tmp:1777"}, extra...)
	if err := run(args); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	files, _ := readTar(t, f)
	var idx index
	if err := json.Unmarshal(files["index.json"], &idx); err != nil {
		t.Fatal(err)
	}
	if len(idx.Manifests) != 1 {
		t.Fatalf("index.json lists %d images, want 1", len(idx.Manifests))
	}
	top := idx.Manifests[0]
	if top.Annotations["io.containerd.image.name"] != "registry.example/team/tether:0.1.0" ||
		top.Annotations["org.opencontainers.image.ref.name"] != "0.1.0" {
		t.Fatalf("annotations %v", top.Annotations)
	}
	return top.Digest, files
}

func TestImageLayoutAndReproducibility(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "tether-amd64")
	if err := os.WriteFile(bin, []byte("binary"), 0o600); err != nil {
		t.Fatal(err)
	}
	first, files := build(t, dir, filepath.Join(dir, "tether-{arch}")+":/tether")
	second, _ := build(t, dir, filepath.Join(dir, "tether-{arch}")+":/tether")
	if first != second {
		t.Fatalf("two builds of the same input: %s and %s", first, second)
	}

	var manifest struct {
		MediaType string       `json:"mediaType"`
		Config    descriptor   `json:"config"`
		Layers    []descriptor `json:"layers"`
	}
	if err := json.Unmarshal(blob(t, files, first), &manifest); err != nil {
		t.Fatal(err)
	}
	if manifest.MediaType != mediaManifest || len(manifest.Layers) != 1 {
		t.Fatalf("manifest %+v", manifest)
	}
	var config struct {
		Architecture string `json:"architecture"`
		Config       struct {
			User       string
			Entrypoint []string
		} `json:"config"`
		RootFS struct {
			DiffIDs []string `json:"diff_ids"`
		} `json:"rootfs"`
	}
	if err := json.Unmarshal(blob(t, files, manifest.Config.Digest), &config); err != nil {
		t.Fatal(err)
	}
	if config.Architecture != "amd64" || config.Config.User != "65532:65532" ||
		len(config.Config.Entrypoint) != 1 || config.Config.Entrypoint[0] != "/tether" {
		t.Fatalf("config %+v", config)
	}

	zr, err := gzip.NewReader(bytes.NewReader(blob(t, files, manifest.Layers[0].Digest)))
	if err != nil {
		t.Fatal(err)
	}
	layerTar, err := io.ReadAll(zr)
	if err != nil {
		t.Fatal(err)
	}
	if sha256Digest(layerTar) != config.RootFS.DiffIDs[0] {
		t.Fatal("diff_id is not the digest of the uncompressed layer")
	}
	content, headers := readTar(t, bytes.NewReader(layerTar))
	if string(content["tether"]) != "binary" || headers["tether"].Mode != 0o555 {
		t.Fatalf("tether entry: %q mode %o", content["tether"], headers["tether"].Mode)
	}
	if h := headers["proxy-server"]; h == nil || h.Typeflag != tar.TypeSymlink || h.Linkname != "tether" {
		t.Fatalf("proxy-server entry %+v", h)
	}
	if h := headers["tmp/"]; h == nil || h.Typeflag != tar.TypeDir || h.Mode != 0o1777 {
		t.Fatalf("tmp entry %+v", h)
	}
	for name, h := range headers {
		if !h.ModTime.Equal(epoch) || h.Uid != 0 || h.Gid != 0 {
			t.Fatalf("%s: time %v owner %d:%d", name, h.ModTime, h.Uid, h.Gid)
		}
	}
}

func TestMultiArchitectureIndex(t *testing.T) {
	dir := t.TempDir()
	for _, arch := range []string{"amd64", "arm64"} {
		if err := os.WriteFile(filepath.Join(dir, "tether-"+arch), []byte("binary for "+arch), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	digest, files := build(t, dir, "-arch", "amd64", "-arch", "arm64", filepath.Join(dir, "tether-{arch}")+":/tether")
	var idx index
	if err := json.Unmarshal(blob(t, files, digest), &idx); err != nil {
		t.Fatal(err)
	}
	var arches []string
	for _, m := range idx.Manifests {
		if m.Platform == nil || m.Platform.OS != "linux" {
			t.Fatalf("manifest without a linux platform: %+v", m)
		}
		arches = append(arches, m.Platform.Architecture)
		blob(t, files, m.Digest)
	}
	sort.Strings(arches)
	if strings.Join(arches, ",") != "amd64,arm64" {
		t.Fatalf("platforms %v", arches)
	}
}

func TestBadArguments(t *testing.T) {
	dir := t.TempDir()
	cases := map[string][]string{
		"missing -name":     {"-o", filepath.Join(dir, "x.tar"), "-entrypoint", "/x"},
		"relative dest":     {"-o", filepath.Join(dir, "x.tar"), "-name", "a:1", "-entrypoint", "/x", "src:x"},
		"unreadable source": {"-o", filepath.Join(dir, "x.tar"), "-name", "a:1", "-entrypoint", "/x", filepath.Join(dir, "absent") + ":/x"},
		"bad mode":          {"-o", filepath.Join(dir, "x.tar"), "-name", "a:1", "-entrypoint", "/x", "-dir", "/tmp:99"},
		"duplicate path":    {"-o", filepath.Join(dir, "x.tar"), "-name", "a:1", "-entrypoint", "/x", "-dir", "/x", "-symlink", "/x=y"},
	}
	for name, args := range cases {
		if err := run(args); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "x.tar")); !os.IsNotExist(err) {
		t.Errorf("a failed run left x.tar behind: %v", err)
	}
}
