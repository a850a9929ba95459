package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"fmt"
	"os"
	"path"
	"sort"
	"strconv"
	"strings"
	"time"
)

// entry is one thing in the image's only layer: a file copied from source, an empty
// directory, or a symbolic link.
type entry struct {
	path    string
	mode    int64
	source  string
	dir     bool
	symlink string
}

// epoch is every entry's modification time, so the layer's bytes depend only on its content.
var epoch = time.Unix(0, 0).UTC()

func parsePathMode(s string, defaultMode int64) (entry, error) {
	p, modeText, hasMode := strings.Cut(s, ":")
	if !strings.HasPrefix(p, "/") || path.Clean(p) != p || p == "/" {
		return entry{}, fmt.Errorf("%q is not a clean absolute path", p)
	}
	mode := defaultMode
	if hasMode {
		m, err := strconv.ParseInt(modeText, 8, 32)
		if err != nil || m < 0 || m > 0o7777 {
			return entry{}, fmt.Errorf("mode %q is not an octal file mode", modeText)
		}
		mode = m
	}
	return entry{path: p, mode: mode}, nil
}

// layer is a gzip-compressed tar with its two digests: of the compressed blob (what the
// manifest names) and of the tar itself (the config's diff_id).
type layer struct {
	blob   []byte
	digest string
	diffID string
}

// buildLayer writes entries for one architecture, parents first, sorted by path. Every
// directory a path needs is created with mode 0755; owners are root.
func buildLayer(entries []entry, arch string) (layer, error) {
	byPath := map[string]entry{}
	for _, e := range entries {
		if _, dup := byPath[e.path]; dup {
			return layer{}, fmt.Errorf("%s is named twice", e.path)
		}
		byPath[e.path] = e
		for dir := path.Dir(e.path); dir != "/"; dir = path.Dir(dir) {
			if _, ok := byPath[dir]; !ok {
				byPath[dir] = entry{path: dir, dir: true, mode: 0o755}
			}
		}
	}
	paths := make([]string, 0, len(byPath))
	for p := range byPath {
		paths = append(paths, p)
	}
	sort.Strings(paths)

	var tarBytes bytes.Buffer
	tw := tar.NewWriter(&tarBytes)
	for _, p := range paths {
		e := byPath[p]
		if !e.dir && e.symlink == "" && byPath[path.Dir(p)].symlink != "" {
			return layer{}, fmt.Errorf("%s is inside a symbolic link", p)
		}
		hdr := &tar.Header{
			Name:    strings.TrimPrefix(p, "/"),
			Mode:    e.mode,
			ModTime: epoch,
			Format:  tar.FormatPAX,
		}
		var content []byte
		switch {
		case e.dir:
			hdr.Typeflag = tar.TypeDir
			hdr.Name += "/"
		case e.symlink != "":
			hdr.Typeflag = tar.TypeSymlink
			hdr.Linkname = e.symlink
			hdr.Mode = 0o777
		default:
			src := strings.ReplaceAll(e.source, "{arch}", arch)
			data, err := os.ReadFile(src)
			if err != nil {
				return layer{}, fmt.Errorf("reading %s for %s: %v", src, p, err)
			}
			content = data
			hdr.Typeflag = tar.TypeReg
			hdr.Size = int64(len(data))
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return layer{}, err
		}
		if _, err := tw.Write(content); err != nil {
			return layer{}, err
		}
	}
	if err := tw.Close(); err != nil {
		return layer{}, err
	}

	var gz bytes.Buffer
	zw, err := gzip.NewWriterLevel(&gz, gzip.BestCompression)
	if err != nil {
		return layer{}, err
	}
	if _, err := zw.Write(tarBytes.Bytes()); err != nil {
		return layer{}, err
	}
	if err := zw.Close(); err != nil {
		return layer{}, err
	}
	return layer{
		blob:   gz.Bytes(),
		digest: sha256Digest(gz.Bytes()),
		diffID: sha256Digest(tarBytes.Bytes()),
	}, nil
}

func sha256Digest(b []byte) string {
	return fmt.Sprintf("sha256:%x", sha256.Sum256(b))
}
