package main

import (
	"archive/tar"
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"strings"
)

const (
	mediaManifest = "application/vnd.oci.image.manifest.v1+json"
	mediaIndex    = "application/vnd.oci.image.index.v1+json"
	mediaConfig   = "application/vnd.oci.image.config.v1+json"
	mediaLayer    = "application/vnd.oci.image.layer.v1.tar+gzip"
)

type imageSpec struct {
	name       string
	entrypoint string
	user       string
	env        []string
	entries    []entry
}

type descriptor struct {
	MediaType   string            `json:"mediaType"`
	Digest      string            `json:"digest"`
	Size        int               `json:"size"`
	Platform    *platform         `json:"platform,omitempty"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

type platform struct {
	Architecture string `json:"architecture"`
	OS           string `json:"os"`
}

// blobs holds every blob of the layout by digest.
type blobs map[string][]byte

func (b blobs) add(mediaType string, data []byte) descriptor {
	d := sha256Digest(data)
	b[d] = data
	return descriptor{MediaType: mediaType, Digest: d, Size: len(data)}
}

func (b blobs) addJSON(mediaType string, v any) (descriptor, error) {
	data, err := json.Marshal(v)
	if err != nil {
		return descriptor{}, err
	}
	return b.add(mediaType, data), nil
}

// writeLayout writes the OCI image layout of spec for arches to out as a tarball and returns
// the digest that names the image: its manifest's for one architecture, its index's for more.
func writeLayout(out string, spec imageSpec, arches []string) (string, error) {
	store := blobs{}
	var manifests []descriptor
	for _, arch := range arches {
		m, err := addImage(store, spec, arch)
		if err != nil {
			return "", err
		}
		manifests = append(manifests, m)
	}
	top := manifests[0]
	if len(manifests) > 1 {
		var err error
		top, err = store.addJSON(mediaIndex, map[string]any{
			"schemaVersion": 2,
			"mediaType":     mediaIndex,
			"manifests":     manifests,
		})
		if err != nil {
			return "", err
		}
	}
	top.Platform = nil
	top.Annotations = map[string]string{
		"io.containerd.image.name":          spec.name,
		"org.opencontainers.image.ref.name": refTag(spec.name),
	}
	index, err := json.Marshal(map[string]any{
		"schemaVersion": 2,
		"mediaType":     mediaIndex,
		"manifests":     []descriptor{top},
	})
	if err != nil {
		return "", err
	}
	files := map[string][]byte{
		"oci-layout": []byte(`{"imageLayoutVersion":"1.0.0"}`),
		"index.json": index,
	}
	for d, data := range store {
		files["blobs/sha256/"+strings.TrimPrefix(d, "sha256:")] = data
	}
	return top.Digest, writeTar(out, files)
}

// addImage adds one architecture's layer, config and manifest, and returns the manifest's
// descriptor with its platform.
func addImage(store blobs, spec imageSpec, arch string) (descriptor, error) {
	l, err := buildLayer(spec.entries, arch)
	if err != nil {
		return descriptor{}, err
	}
	layerDesc := store.add(mediaLayer, l.blob)
	config := map[string]any{
		"architecture": arch,
		"os":           "linux",
		"config": map[string]any{
			"User":       spec.user,
			"Entrypoint": []string{spec.entrypoint},
			"Env":        spec.env,
		},
		"rootfs": map[string]any{"type": "layers", "diff_ids": []string{l.diffID}},
	}
	configDesc, err := store.addJSON(mediaConfig, config)
	if err != nil {
		return descriptor{}, err
	}
	m, err := store.addJSON(mediaManifest, map[string]any{
		"schemaVersion": 2,
		"mediaType":     mediaManifest,
		"config":        configDesc,
		"layers":        []descriptor{layerDesc},
	})
	if err != nil {
		return descriptor{}, err
	}
	m.Platform = &platform{Architecture: arch, OS: "linux"}
	return m, nil
}

// refTag is the tag of a reference (what org.opencontainers.image.ref.name holds in a layout).
func refTag(ref string) string {
	slash := strings.LastIndex(ref, "/")
	if colon := strings.LastIndex(ref, ":"); colon > slash {
		return ref[colon+1:]
	}
	return "latest"
}

// writeTar writes files sorted by name with fixed metadata, through a temporary file renamed
// into place, so a failed run leaves no half-written image behind.
func writeTar(out string, files map[string][]byte) error {
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	sort.Strings(names)
	tmp, err := os.CreateTemp(dirOf(out), ".mkimage-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if err := tmp.Chmod(0o644); err != nil {
		return err
	}
	tw := tar.NewWriter(tmp)
	dirs := map[string]bool{}
	for _, n := range names {
		for _, d := range []string{"blobs/", "blobs/sha256/"} {
			if strings.HasPrefix(n, d) && !dirs[d] {
				dirs[d] = true
				if err := tw.WriteHeader(&tar.Header{Name: d, Typeflag: tar.TypeDir, Mode: 0o755, ModTime: epoch, Format: tar.FormatPAX}); err != nil {
					return err
				}
			}
		}
		data := files[n]
		if err := tw.WriteHeader(&tar.Header{Name: n, Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(data)), ModTime: epoch, Format: tar.FormatPAX}); err != nil {
			return err
		}
		if _, err := tw.Write(data); err != nil {
			return err
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp.Name(), out); err != nil {
		return fmt.Errorf("writing %s: %v", out, err)
	}
	return nil
}

func dirOf(p string) string {
	if i := strings.LastIndex(p, "/"); i >= 0 {
		return p[:i+1]
	}
	return "."
}
