package main

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"strings"
)

func hostname(args []string) error {
	if len(args) != 0 {
		return errors.New("takes no arguments")
	}
	h, err := os.Hostname()
	if err != nil {
		return err
	}
	fmt.Println(h)
	return nil
}

// identity prints what a securityContext controls, on one line, for a flow to compare:
//
//	uid=65532 gid=65532 groups=65532 NoNewPrivs=1 Seccomp=2 CapEff=0000000000000000 CapBnd=... rootfs-writable=false
func identity(args []string) error {
	if len(args) != 0 {
		return errors.New("takes no arguments")
	}
	status, err := procStatus()
	if err != nil {
		return err
	}
	groups, err := os.Getgroups()
	if err != nil {
		return err
	}
	gs := make([]string, len(groups))
	for i, g := range groups {
		gs[i] = fmt.Sprint(g)
	}
	fmt.Printf("uid=%d gid=%d groups=%s", os.Getuid(), os.Getgid(), strings.Join(gs, ","))
	for _, k := range []string{"NoNewPrivs", "Seccomp", "CapEff", "CapPrm", "CapBnd"} {
		fmt.Printf(" %s=%s", k, status[k])
	}
	fmt.Printf(" rootfs-writable=%t\n", rootfsWritable())
	return nil
}

func procStatus() (map[string]string, error) {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fields := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), ":"); ok {
			fields[k] = strings.TrimSpace(v)
		}
	}
	return fields, sc.Err()
}

// rootfsWritable tries to create a file in / (readOnlyRootFilesystem makes that EROFS).
func rootfsWritable() bool {
	f, err := os.CreateTemp("/", ".node-app-probe-")
	if err != nil {
		return false
	}
	f.Close()
	os.Remove(f.Name())
	return true
}
