package main

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// tarOptions is the part of tar's command line that kubectl cp uses:
//
//	tar cf - PATH                                     (from a pod)
//	tar -xmf - -C DIR                                 (into a pod)
//	tar --no-same-permissions --no-same-owner -xmf - -C DIR
type tarOptions struct {
	create, extract bool
	keepMtime       bool // false with m: extracted files get the time of extraction
	samePerms       bool // false with --no-same-permissions: modes are masked by the umask
	file            string
	dir             string
	paths           []string
}

func parseTar(args []string) (tarOptions, error) {
	o := tarOptions{keepMtime: true, samePerms: true, dir: "."}
	modeSeen := false
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch {
		case a == "--no-same-owner": // never chowns anyway: the workload is not root
		case a == "--no-same-permissions":
			o.samePerms = false
		case a == "-C":
			if i+1 == len(args) {
				return o, errors.New("-C needs a directory")
			}
			i++
			o.dir = args[i]
		case strings.HasPrefix(a, "--"):
			return o, fmt.Errorf("option %s not supported (only what kubectl cp uses)", a)
		case strings.HasPrefix(a, "-") || !modeSeen:
			modeSeen = true
			for _, c := range strings.TrimPrefix(a, "-") {
				switch c {
				case 'c':
					o.create = true
				case 'x':
					o.extract = true
				case 'm':
					o.keepMtime = false
				case 'v':
				case 'f':
					if i+1 == len(args) {
						return o, errors.New("f needs a file name (- for stdin/stdout)")
					}
					i++
					o.file = args[i]
				default:
					return o, fmt.Errorf("flag %q not supported (only c, x, f, m, v)", c)
				}
			}
		default:
			o.paths = append(o.paths, a)
		}
	}
	if o.create == o.extract {
		return o, errors.New("give exactly one of c (create) or x (extract)")
	}
	if o.create && len(o.paths) == 0 {
		return o, errors.New("c needs at least one path")
	}
	return o, nil
}

func tarMain(args []string) error {
	o, err := parseTar(args)
	if err != nil {
		return err
	}
	if o.create {
		out := io.Writer(os.Stdout)
		if o.file != "" && o.file != "-" {
			f, err := os.Create(o.file)
			if err != nil {
				return err
			}
			defer f.Close()
			out = f
		}
		return tarCreate(out, o)
	}
	in := io.Reader(os.Stdin)
	if o.file != "" && o.file != "-" {
		f, err := os.Open(o.file)
		if err != nil {
			return err
		}
		defer f.Close()
		in = f
	}
	return tarExtract(in, o)
}

// tarCreate writes each path (a file, a link or a whole tree) as given, relative to -C DIR, with
// a leading "/" removed as GNU tar does; kubectl cp expects exactly that prefix.
func tarCreate(out io.Writer, o tarOptions) error {
	if err := os.Chdir(o.dir); err != nil {
		return err
	}
	tw := tar.NewWriter(out)
	for _, root := range o.paths {
		err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			return tarAdd(tw, p)
		})
		if err != nil {
			return err
		}
	}
	return tw.Close()
}

func tarAdd(tw *tar.Writer, p string) error {
	info, err := os.Lstat(p)
	if err != nil {
		return err
	}
	link := ""
	if info.Mode()&fs.ModeSymlink != 0 {
		if link, err = os.Readlink(p); err != nil {
			return err
		}
	}
	hdr, err := tar.FileInfoHeader(info, link)
	if err != nil {
		return err
	}
	hdr.Name = strings.TrimLeft(filepath.ToSlash(p), "/")
	if info.IsDir() {
		hdr.Name = strings.TrimSuffix(hdr.Name, "/") + "/"
	}
	if err := tw.WriteHeader(hdr); err != nil {
		return err
	}
	if !info.Mode().IsRegular() {
		return nil
	}
	f, err := os.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = io.Copy(tw, f)
	return err
}

// tarExtract unpacks into o.dir and refuses any entry that would land outside it.
func tarExtract(in io.Reader, o tarOptions) error {
	tr := tar.NewReader(in)
	umask := fs.FileMode(0o022)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		name := filepath.Clean(strings.TrimLeft(hdr.Name, "/"))
		if name == ".." || strings.HasPrefix(name, "../") {
			return fmt.Errorf("entry %q points outside %s", hdr.Name, o.dir)
		}
		target := filepath.Join(o.dir, name)
		mode := fs.FileMode(hdr.Mode) & fs.ModePerm
		if !o.samePerms {
			mode &^= umask
		}
		switch hdr.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(target, mode|0o700); err != nil {
				return err
			}
		case tar.TypeReg:
			if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
				return err
			}
			f, err := os.OpenFile(target, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, mode)
			if err != nil {
				return err
			}
			if _, err := io.Copy(f, tr); err != nil {
				f.Close()
				return err
			}
			if err := f.Close(); err != nil {
				return err
			}
		case tar.TypeSymlink:
			if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
				return err
			}
			os.Remove(target)
			if err := os.Symlink(hdr.Linkname, target); err != nil {
				return err
			}
			continue
		default:
			return fmt.Errorf("entry %q: type %q not supported (files, dirs and symlinks only)", hdr.Name, hdr.Typeflag)
		}
		if o.keepMtime {
			if err := os.Chtimes(target, time.Now(), hdr.ModTime); err != nil {
				return err
			}
		}
	}
}
