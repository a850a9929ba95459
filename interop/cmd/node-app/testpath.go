package main

import (
	"fmt"
	"os"
)

// testPath is test(1)'s file checks; kubectl cp runs "test -d DEST" to decide whether to copy
// into a directory.
func testPath(args []string) error {
	if len(args) != 2 {
		return fmt.Errorf("takes two arguments: -d, -e or -f, and a path")
	}
	info, err := os.Stat(args[1])
	ok := false
	switch args[0] {
	case "-e":
		ok = err == nil
	case "-d":
		ok = err == nil && info.IsDir()
	case "-f":
		ok = err == nil && info.Mode().IsRegular()
	default:
		return fmt.Errorf("check %q not supported (only -d, -e, -f)", args[0])
	}
	if !ok {
		os.Exit(1) // test's quiet "no"
	}
	return nil
}
