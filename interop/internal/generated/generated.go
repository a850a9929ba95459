// Package generated rewrites the blocks of a document (COMPATIBILITY.md) that programs write
// from what ran: the text from a begin marker to an end marker, both included.
package generated

import (
	"fmt"
	"os"
	"strings"
)

// Replace returns text with its block from begin to end replaced by block, which carries its
// own markers.
func Replace(text, begin, end, block string) (string, error) {
	i, j := strings.Index(text, begin), strings.Index(text, end)
	if i < 0 || j < i {
		return "", fmt.Errorf("no %q ... %q block", begin, end)
	}
	return text[:i] + strings.TrimRight(block, "\n") + text[j+len(end):], nil
}

// ReplaceInFile is Replace on the file at path.
func ReplaceInFile(path, begin, end, block string) error {
	old, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	s, err := Replace(string(old), begin, end, block)
	if err != nil {
		return fmt.Errorf("%s: %v", path, err)
	}
	return os.WriteFile(path, []byte(s), 0o644)
}
