package main

import (
	"errors"
	"io"
	"os"
)

// catStdin copies stdin to stdout until EOF: the far end of exec -i and attach -i.
func catStdin(args []string) error {
	if len(args) != 0 {
		return errors.New("takes no arguments (use cat-file FILE for a file)")
	}
	_, err := io.Copy(os.Stdout, os.Stdin)
	return err
}

// catFile prints one file, since the image has no shell or coreutils.
func catFile(args []string) error {
	if len(args) != 1 {
		return errors.New("takes one argument, the file")
	}
	f, err := os.Open(args[0])
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = io.Copy(os.Stdout, f)
	return err
}
